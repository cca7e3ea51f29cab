package userspace

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// A keeper runs userspace devices on request, in a process that lives
// apart from twilld: on Kubernetes, the kube-twill-wireguard DaemonSet,
// whose pods are not replaced when twilld's are (upgrades included), so
// the devices and pod traffic carry on while twilld restarts. twilld asks
// it for a device over a unix socket; a device lives until the keeper
// stops or the device's TUN link is deleted.

// Request asks a keeper for a device; the keeper answers with a Reply.
type Request struct {
	Name   string
	Socket string
	MTU    int
}

// Reply is a keeper's answer: Error is empty when the device runs.
type Reply struct {
	Error string `json:",omitempty"`
}

// KeeperOptions configure RunKeeper.
type KeeperOptions struct {
	Logger *slog.Logger
	Socket string
	// device runs one device (tests replace it); nil is Run.
	device func(ctx context.Context, o Options) error
}

// RunKeeper serves device requests on o.Socket until ctx is done; its
// devices stop with it.
func RunKeeper(ctx context.Context, o KeeperOptions) error {
	if o.device == nil {
		o.device = Run
	}
	if err := os.MkdirAll(filepath.Dir(o.Socket), 0o700); err != nil {
		return fmt.Errorf("creating the socket's directory: %w", err)
	}
	if c, err := net.Dial("unix", o.Socket); err == nil {
		c.Close()
		return fmt.Errorf("a keeper already serves %s", o.Socket)
	}
	_ = os.Remove(o.Socket)
	l, err := net.Listen("unix", o.Socket)
	if err != nil {
		return fmt.Errorf("serving %s: %w", o.Socket, err)
	}
	if err := os.Chmod(o.Socket, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("restricting %s: %w", o.Socket, err)
	}
	k := &keeper{o: o, ctx: ctx, running: map[string]bool{}}
	go func() { <-ctx.Done(); l.Close() }()
	o.Logger.Info("keeping userspace WireGuard devices", "socket", o.Socket)
	for {
		c, err := l.Accept()
		if err != nil {
			break
		}
		go k.serve(c)
	}
	k.wg.Wait()
	return nil
}

type keeper struct {
	o   KeeperOptions
	ctx context.Context
	wg  sync.WaitGroup

	mu      sync.Mutex
	running map[string]bool // guarded by mu: devices by name
}

func (k *keeper) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	var req Request
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	if err == nil {
		err = k.start(req)
	}
	var rep Reply
	if err != nil {
		rep.Error = err.Error()
	}
	b, _ := json.Marshal(rep)
	_, _ = c.Write(append(b, '\n'))
}

// start runs the device unless it runs already, and waits until it serves
// its socket.
func (k *keeper) start(req Request) error {
	if req.Name == "" || req.Socket == "" || !filepath.IsAbs(req.Socket) {
		return fmt.Errorf("a device needs a name and an absolute socket path (got %q, %q)", req.Name, req.Socket)
	}
	k.mu.Lock()
	if !k.running[req.Name] {
		k.running[req.Name] = true
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			log := k.o.Logger.With("device", req.Name)
			if err := k.o.device(k.ctx, Options{Logger: log, Name: req.Name, Socket: req.Socket, MTU: req.MTU}); err != nil {
				log.Error("the device stopped", "err", err)
			}
			k.mu.Lock()
			delete(k.running, req.Name)
			k.mu.Unlock()
		}()
	}
	k.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", req.Socket); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("device %s did not serve %s within 10s", req.Name, req.Socket)
		}
		select {
		case <-k.ctx.Done():
			return errors.New("the keeper is stopping")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Ask asks the keeper at socket for a device.
func Ask(ctx context.Context, socket string, req Request) error {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("asking the keeper at %s: %w", socket, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("asking the keeper at %s: %w", socket, err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("asking the keeper at %s: %w", socket, err)
	}
	var rep Reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return fmt.Errorf("the keeper at %s answered %q: %w", socket, line, err)
	}
	if rep.Error != "" {
		return fmt.Errorf("the keeper at %s: %s", socket, rep.Error)
	}
	return nil
}

// Answers reports whether a keeper serves socket.
func Answers(socket string) bool {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

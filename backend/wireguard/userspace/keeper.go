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

	"github.com/twill-net/twill/backend/wireguard/wgkeeper"
)

// The keeper's side of package wgkeeper's protocol: it runs userspace
// devices on twilld's request.

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
	var req wgkeeper.Request
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	if err == nil {
		err = k.start(req)
	}
	var rep wgkeeper.Reply
	if err != nil {
		rep.Error = err.Error()
	}
	b, _ := json.Marshal(rep)
	_, _ = c.Write(append(b, '\n'))
}

// start runs the device unless it runs already, and waits until it serves
// its socket.
func (k *keeper) start(req wgkeeper.Request) error {
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

package userspace

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/tuntest"

	"github.com/twill-net/twill/backend/wireguard/uapi"
	"github.com/twill-net/twill/backend/wireguard/wgkeeper"
)

// TestKeeper: a keeper runs the device asked for (once, however often it
// is asked), refuses a request it cannot serve, and stops its devices with
// it.
func TestKeeper(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "keeper.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	started := 0
	go func() {
		done <- RunKeeper(ctx, KeeperOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Socket: sock,
			device: func(ctx context.Context, o Options) error {
				started++
				o.TUN, o.Bind = tuntest.NewChannelTUN().TUN(), &DiscardBind{}
				return Run(ctx, o)
			}})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !wgkeeper.Answers(sock) {
		if time.Now().After(deadline) {
			t.Fatal("the keeper never served its socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
	devSock := filepath.Join(dir, "twill-wg.sock")
	for range 2 {
		if err := wgkeeper.Ask(ctx, sock, wgkeeper.Request{Name: "twill-wg", Socket: devSock, MTU: 1420}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := (&uapi.Client{Path: devSock}).Get(ctx); err != nil {
		t.Fatalf("the device does not answer: %v", err)
	}
	if started != 1 {
		t.Fatalf("the device was started %d times", started)
	}
	if err := wgkeeper.Ask(ctx, sock, wgkeeper.Request{Name: "x", Socket: "relative.sock"}); err == nil || !strings.Contains(err.Error(), "absolute socket path") {
		t.Fatalf("a relative socket path: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := (&uapi.Client{Path: devSock}).Get(context.Background()); err == nil {
		t.Fatal("the device outlived its keeper")
	}
}

package integration

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/poll"
)

// A token that expires under a running client: the writes a close
// acknowledged before it expired still reach the server (stored while the
// token holds, not by a flusher that would find it expired), and new
// writes, opens for writing included, are refused with EKEYEXPIRED and a
// log line naming the user, not accepted into the cache and lost later.
func TestTokenExpiryKeepsAcknowledgedWrites(t *testing.T) {
	srv := startServer(t, t.TempDir())
	admin := dialAs(t, srv.addr, testCell.admin)
	if err := admin.Mkdir("/erin", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := admin.Admin().CreateUser("erin", 1005); err != nil {
		t.Fatal(err)
	}
	mustACL(t, admin, "/erin", "erin", access.All)
	tok := issue(t, "erin", 1005, "--expires", "8s")
	claims, err := cell.Inspect(tok)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuf{}
	// Write-back with a flush age far past the token's life: only the
	// token's expiry makes the client store before it.
	erin, err := cellDial(client.Options{Server: srv.addr, Token: tok, CacheDir: t.TempDir(), CacheSize: 16 << 20,
		DialTimeout: 5 * time.Second, RPCTimeout: 10 * time.Second, FlushAge: time.Hour, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer erin.Close()
	writeAs(t, erin, "/erin/before", "written before the token expired")
	open, err := erin.Open("/erin/open", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	poll.Wait(t, 15*time.Second, "the token to expire", func() bool { return time.Now().After(claims.Expires.Add(time.Second)) })

	if got, err := readAs(admin, "/erin/before"); err != nil || got != "written before the token expired" {
		t.Fatalf("a write acknowledged before the token expired, read at the server after: %q %v", got, err)
	}
	if _, err := open.Write([]byte("late")); !errors.Is(err, syscall.EKEYEXPIRED) {
		t.Fatalf("a write after the token expired: %v, want EKEYEXPIRED", err)
	}
	if _, err := erin.Create("/erin/after"); !errors.Is(err, syscall.EKEYEXPIRED) {
		t.Fatalf("a create after the token expired: %v, want EKEYEXPIRED", err)
	}
	if !strings.Contains(logs.String(), "token expired") || !strings.Contains(logs.String(), "erin") {
		t.Fatalf("no log line about the expired token:\n%s", logs)
	}
	if n := strings.Count(logs.String(), "token expired: refusing"); n != 1 {
		t.Fatalf("%d log lines about one expired token:\n%s", n, logs)
	}
}

func readAs(c *pathfs.FS, name string) (string, error) {
	f, err := c.Open(name, os.O_RDONLY, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, 1<<16)
	n, err := f.Read(b)
	if err != nil && n == 0 {
		return "", err
	}
	return string(b[:n]), nil
}

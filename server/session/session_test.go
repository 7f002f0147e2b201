package session

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A token checks out only as the server made it: a changed id, line or
// epoch, a changed mac, another server's key are all refused.
func TestSessionTokenUnforgeable(t *testing.T) {
	k1, k2 := Key(bytes.Repeat([]byte{1}, KeySize)), Key(bytes.Repeat([]byte{2}, KeySize))
	tok := k1.Make(Token{Epoch: 7, ID: 3, Line: 2})
	got, err := k1.Parse(tok)
	if err != nil || got != (Token{Epoch: 7, ID: 3, Line: 2}) {
		t.Fatalf("own token: %+v, %v", got, err)
	}
	body, mac, _ := cutLast(tok, ".")
	forged := []string{
		"7.4.2." + mac, // another session, same mac
		"7.3.1." + mac, // another line
		"8.3.2." + mac, // another epoch
		body + "." + strings.Repeat("0", 2*macSize), // a made-up mac
		k2.Make(Token{Epoch: 7, ID: 3, Line: 2}),    // another server's
	}
	for _, f := range forged {
		if _, err := k1.Parse(f); status.Code(err) != codes.Unauthenticated {
			t.Errorf("forged token %q: %v, want Unauthenticated", f, err)
		}
	}
	for _, bad := range []string{"", "7.3", "7.3.2", "7.3.2.zz", "a.b.c." + mac, "7.3.2.1." + mac, strings.Repeat("7", 1<<20) + ".3.2." + mac} {
		if _, err := k1.Parse(bad); err == nil {
			t.Errorf("malformed token %q accepted", bad)
		}
	}
}

// The key is made once, private, and read back the same at the next start;
// a damaged one stops the start with a clear message.
func TestLoadKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "session.key")
	k, err := LoadKey(path)
	if err != nil || len(k) != KeySize {
		t.Fatalf("first load: %d bytes, %v", len(k), err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi, err)
	}
	again, err := LoadKey(path)
	if err != nil || !bytes.Equal(again, k) {
		t.Fatalf("second load differs: %v", err)
	}
	os.WriteFile(path, []byte("short"), 0o600)
	if _, err := LoadKey(path); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Fatalf("damaged key: %v", err)
	}
}

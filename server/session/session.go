// Package session makes and checks session tokens. A session token,
// "<epoch>.<id>.<line>.<mac>", names a client's session on every request.
// The mac, 128 bits of HMAC-SHA256 under the server's key, makes it
// unforgeable: a process cannot act as another session by counting ids,
// nor claim to continue another client's line of sessions (and so
// reclaim its delegations) by giving the same name. Delegation state ids
// are honoured only for the session holding them, so they need no secret
// of their own. The key outlives restarts (LoadKey), so a token of an
// earlier server life still proves who held what in the grace period
// after a restart.
package session

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/callback"
)

const (
	KeySize = 32
	macSize = 16
	// MaxToken is far past the longest token (three 20-digit numbers and
	// the mac): a longer one is not parsed at all.
	MaxToken = 128
)

// LoadKey reads the server's session key from path, making one the first
// time (0600: whoever reads it can make tokens).
func LoadKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	switch {
	case err == nil && len(key) == KeySize:
		return key, nil
	case err == nil:
		return nil, fmt.Errorf("session key %s: %d bytes, want %d (remove it to make a new one; clients then reconnect)", path, len(key), KeySize)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("session key: %w", err)
	}
	key = make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".session-key-*")
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(key); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	return key, nil
}

// Token is what a valid token says: session ID, of Line, in Epoch (the
// server life that made it).
type Token struct {
	Epoch    uint64
	ID, Line callback.ClientID
}

// Key makes and checks tokens: a server's session key.
type Key []byte

// Make is t's token.
func (k Key) Make(t Token) string {
	body := fmt.Sprintf("%d.%d.%d", t.Epoch, t.ID, t.Line)
	return body + "." + hex.EncodeToString(k.mac(body))
}

func (k Key) mac(body string) []byte {
	m := hmac.New(sha256.New, k)
	m.Write([]byte(body))
	return m.Sum(nil)[:macSize]
}

// Parse checks tok's mac and returns what it says, of any epoch.
func (k Key) Parse(tok string) (Token, error) {
	if len(tok) > MaxToken {
		return Token{}, status.Errorf(codes.InvalidArgument, "malformed session token")
	}
	body, sum, ok := cutLast(tok, ".")
	f := strings.Split(body, ".")
	if !ok || len(f) != 3 || len(sum) != 2*macSize {
		return Token{}, status.Errorf(codes.InvalidArgument, "malformed session token")
	}
	got, err := hex.DecodeString(sum)
	if err != nil || !hmac.Equal(got, k.mac(body)) {
		return Token{}, status.Errorf(codes.Unauthenticated, "session token not made by this server: reconnect")
	}
	var n [3]uint64
	for i := range n {
		if n[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
			return Token{}, status.Errorf(codes.InvalidArgument, "malformed session token")
		}
	}
	return Token{Epoch: n[0], ID: callback.ClientID(n[1]), Line: callback.ClientID(n[2])}, nil
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

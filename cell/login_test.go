package cell

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func caPEMOf(t *testing.T, cellDir string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(cellDir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestLogins(t *testing.T) {
	base := filepath.Join(t.TempDir(), "hoard")
	alpha, beta := newTokenCell(t, "alpha"), newTokenCell(t, "beta")
	ta, ca, _ := alpha.iss.Issue(Claims{User: "alice", UID: 1001}, time.Hour)
	tb, _, _ := beta.iss.Issue(Claims{User: "bob", UID: 1002, Admin: true}, time.Hour)

	if ls, err := Logins(base); err != nil || len(ls) != 0 {
		t.Fatalf("Logins before any: %v, %v", ls, err)
	}
	if _, ok, err := DefaultLogin(base); ok || err != nil {
		t.Fatalf("DefaultLogin before any: %v, %v", ok, err)
	}

	l, err := SaveLogin(base, "  "+ta+"\n", caPEMOf(t, alpha.dir))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "cells", "alpha")
	if l.Cell != "alpha" || l.Token != ta || l.CAFile != filepath.Join(dir, CAFile) || !claimsEqual(l.Claims, ca) {
		t.Errorf("SaveLogin: %+v", l)
	}
	for f, want := range map[string]os.FileMode{base: 0o700, dir: 0o700, filepath.Join(dir, "token"): 0o600, filepath.Join(dir, CAFile): 0o644} {
		if m := mode(t, f); m != want {
			t.Errorf("%s mode %v, want %v", f, m, want)
		}
	}
	if _, err := LoadCA(l.CAFile); err != nil {
		t.Errorf("stored CA: %v", err)
	}

	// A second cell, without its CA: it becomes the default.
	if l, err = SaveLogin(base, tb, nil); err != nil || l.CAFile != "" || l.Cell != "beta" {
		t.Fatalf("SaveLogin beta: %+v, %v", l, err)
	}
	if d, ok, err := DefaultLogin(base); !ok || err != nil || d.Cell != "beta" || d.Token != tb || !d.Claims.Admin {
		t.Errorf("DefaultLogin: %+v %v %v", d, ok, err)
	}
	ls, err := Logins(base)
	if err != nil || len(ls) != 2 || ls[0].Cell != "alpha" || ls[1].Cell != "beta" || ls[0].Claims.User != "alice" {
		t.Fatalf("Logins: %+v, %v", ls, err)
	}
	if l, err := LookupLogin(base, "alpha"); err != nil || l.Token != ta {
		t.Errorf("LookupLogin alpha: %+v, %v", l, err)
	}
	if _, err := LookupLogin(base, "gamma"); err == nil || err.Error() != "no login for cell gamma: run hoard login" {
		t.Errorf("LookupLogin gamma: %v", err)
	}
	if _, err := LookupLogin(base, "../etc"); err == nil {
		t.Error("LookupLogin ../etc succeeded")
	}

	// Logging in again replaces the token and keeps the CA stored before.
	ta2, _, _ := alpha.iss.Issue(Claims{User: "alice", UID: 1001}, 2*time.Hour)
	if l, err := SaveLogin(base, ta2, nil); err != nil || l.Token != ta2 || l.CAFile == "" {
		t.Errorf("SaveLogin again: %+v, %v", l, err)
	}
	// But a token of another cell named alpha does not verify with it.
	fake := newTokenCell(t, "alpha")
	tf, _, _ := fake.iss.Issue(Claims{User: "mallory"}, time.Hour)
	if _, err := SaveLogin(base, tf, nil); err == nil || !strings.Contains(err.Error(), "does not verify with the CA certificate stored") {
		t.Errorf("SaveLogin of a same-named cell's token: %v", err)
	}
	if l, _ := LookupLogin(base, "alpha"); l.Token != ta2 {
		t.Error("a refused login replaced the token")
	}

	// Logout of the default (alpha, logged in to last): it goes, beta
	// stays, and there is no default.
	if err := Logout(base, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(base, "cells", "alpha")); !os.IsNotExist(err) {
		t.Errorf("alpha's login left behind: %v", err)
	}
	if _, ok, err := DefaultLogin(base); ok || err != nil {
		t.Errorf("DefaultLogin after its logout: %v, %v", ok, err)
	}
	if ls, err := Logins(base); err != nil || len(ls) != 1 || ls[0].Cell != "beta" {
		t.Errorf("Logins after a logout: %+v, %v", ls, err)
	}
	if err := Logout(base, ""); err == nil {
		t.Error("Logout with no default succeeded")
	}
	if err := Logout(base, "alpha"); err == nil || err.Error() != "no login for cell alpha" {
		t.Errorf("a second Logout of alpha: %v", err)
	}
	if err := Logout(base, "beta"); err != nil {
		t.Fatal(err)
	}
	if ls, err := Logins(base); err != nil || len(ls) != 0 {
		t.Errorf("Logins after logging out of all: %v, %v", ls, err)
	}
}

func TestSaveLoginRefuses(t *testing.T) {
	base := filepath.Join(t.TempDir(), "hoard")
	alpha, beta := newTokenCell(t, "alpha"), newTokenCell(t, "beta")

	// Expired.
	alpha.iss.now = func() time.Time { return time.Now().Add(-2 * time.Hour) }
	old, _, err := alpha.iss.Issue(Claims{User: "alice"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := SaveLogin(base, old, nil); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("SaveLogin of an expired token: %v", err)
	}
	alpha.iss.now = time.Now

	// Not a token.
	if _, err := SaveLogin(base, "hello", nil); err == nil || !strings.Contains(err.Error(), "not a hoard token") {
		t.Errorf("SaveLogin of garbage: %v", err)
	}
	// With the CA of another cell.
	tok, _, _ := alpha.iss.Issue(Claims{User: "alice"}, time.Hour)
	if _, err := SaveLogin(base, tok, caPEMOf(t, beta.dir)); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("SaveLogin with another cell's CA: %v", err)
	}
	// With a CA that is not a certificate.
	if _, err := SaveLogin(base, tok, []byte("junk")); err == nil {
		t.Error("SaveLogin with a junk CA succeeded")
	}
	if _, err := os.Stat(base); !os.IsNotExist(err) {
		t.Errorf("refused logins wrote %s: %v", base, err)
	}
}

func TestConfigDir(t *testing.T) {
	x := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", x)
	if d, err := ConfigDir(); err != nil || d != filepath.Join(x, "hoard") {
		t.Errorf("ConfigDir: %q, %v", d, err)
	}
}

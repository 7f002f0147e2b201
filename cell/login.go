package cell

import (
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/hoardfs/hoard/dirs"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A user's logins live in a base directory (ConfigDir):
//
//	base/default              the default cell's name
//	base/cells/CELL/token     the token (0600)
//	base/cells/CELL/ca.crt    the cell's CA certificate, if given at login
const (
	cellsDir    = "cells"
	defaultFile = "default"
	tokenFile   = "token"
)

// ConfigDir is dirs.UserConfigDir()/hoard.
func ConfigDir() (string, error) {
	d, err := dirs.UserConfigDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "hoard"), nil
}

// Login is a user's stored token for one cell.
type Login struct {
	Cell   string
	Token  string
	CAFile string // path of the stored CA certificate ("" if none was given at login)
	Claims Claims // Inspect's
}

// SaveLogin stores token (and the cell's CA certificate, if caPEM is not nil)
// under base/cells/CELL/ (dir 0700; token file "token" 0600; "ca.crt" 0644),
// CELL being the token's own cell claim (checked: [a-zA-Z0-9._-]{1,64}), and
// makes CELL the default (base/default, a file holding the name).
// A token that does not Inspect is refused. An expired token is refused
// with an error saying so. Writes are atomic.
//
// The token is also verified against the CA certificate when there is
// one (caPEM, else one stored by an earlier login), so a token and a CA of
// different cells are caught here rather than at the first connection.
func SaveLogin(base, token string, caPEM []byte) (Login, error) {
	token = strings.TrimSpace(token)
	c, err := Inspect(token)
	if err != nil {
		return Login{}, fmt.Errorf("not a hoard token: %v", err)
	}
	if err := checkName("cell", c.Cell); err != nil {
		return Login{}, err
	}
	if !time.Now().Before(c.Expires) {
		return Login{}, fmt.Errorf("the token of %s in cell %s expired at %s", c.User, c.Cell, c.Expires.Format(time.RFC3339))
	}
	dir := filepath.Join(base, cellsDir, c.Cell)
	caFile := filepath.Join(dir, CAFile)
	if caPEM != nil {
		ca, err := parseCert(caPEM)
		if err != nil {
			return Login{}, fmt.Errorf("the CA certificate: %v", err)
		}
		if err := verifyWith(ca, token); err != nil {
			return Login{}, fmt.Errorf("the token of cell %s does not verify with the CA certificate given: %v", c.Cell, err)
		}
	} else if ca, err := readCert(caFile, caFile); err == nil {
		if err := verifyWith(ca, token); err != nil {
			return Login{}, fmt.Errorf("the token of cell %s does not verify with the CA certificate stored at %s (give the cell's CA certificate with the token): %v", c.Cell, caFile, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Login{}, fmt.Errorf("%s: %s", dir, why(err))
	}
	if caPEM != nil {
		if err := writeFile(caFile, caPEM, 0o644, false); err != nil {
			return Login{}, fmt.Errorf("%s: %s", caFile, why(err))
		}
	}
	tf := filepath.Join(dir, tokenFile)
	if err := writeFile(tf, []byte(token+"\n"), 0o600, false); err != nil {
		return Login{}, fmt.Errorf("%s: %s", tf, why(err))
	}
	df := filepath.Join(base, defaultFile)
	if err := writeFile(df, []byte(c.Cell+"\n"), 0o600, false); err != nil {
		return Login{}, fmt.Errorf("%s: %s", df, why(err))
	}
	return readLogin(base, c.Cell)
}

// verifyWith verifies token with the cell CA ca.
func verifyWith(ca *x509.Certificate, token string) error {
	v, err := NewVerifier(ca, nil)
	if err != nil {
		return err
	}
	_, err = v.Verify(token)
	return err
}

// readLogin reads the login for cell; an error wrapping fs.ErrNotExist
// when there is none.
func readLogin(base, cell string) (Login, error) {
	dir := filepath.Join(base, cellsDir, cell)
	tf := filepath.Join(dir, tokenFile)
	data, err := os.ReadFile(tf)
	if err != nil {
		return Login{}, err
	}
	token := strings.TrimSpace(string(data))
	c, err := Inspect(token)
	if err != nil {
		return Login{}, fmt.Errorf("%s: %v", tf, err)
	}
	l := Login{Cell: cell, Token: token, Claims: c}
	if _, err := os.Stat(filepath.Join(dir, CAFile)); err == nil {
		l.CAFile = filepath.Join(dir, CAFile)
	}
	return l, nil
}

// Logins lists the stored logins, sorted by cell.
func Logins(base string) ([]Login, error) {
	es, err := os.ReadDir(filepath.Join(base, cellsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ls []Login
	for _, e := range es { // ReadDir sorts by name
		if !e.IsDir() || checkName("cell", e.Name()) != nil {
			continue
		}
		l, err := readLogin(base, e.Name())
		if errors.Is(err, fs.ErrNotExist) {
			continue // a directory whose token was never written
		}
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// defaultCell is the name in base/default ("" if there is none).
func defaultCell(base string) (string, error) {
	df := filepath.Join(base, defaultFile)
	data, err := os.ReadFile(df)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	name := strings.TrimSpace(string(data))
	if err := checkName("cell", name); err != nil {
		return "", fmt.Errorf("%s: %v", df, err)
	}
	return name, nil
}

// DefaultLogin is the default cell's login (ok false if none).
func DefaultLogin(base string) (Login, bool, error) {
	name, err := defaultCell(base)
	if err != nil || name == "" {
		return Login{}, false, err
	}
	l, err := readLogin(base, name)
	if errors.Is(err, fs.ErrNotExist) {
		return Login{}, false, nil
	}
	if err != nil {
		return Login{}, false, err
	}
	return l, true, nil
}

// LookupLogin is the login for cell (error "no login for cell X: run hoard login").
func LookupLogin(base, cell string) (Login, error) {
	if err := checkName("cell", cell); err != nil {
		return Login{}, err
	}
	l, err := readLogin(base, cell)
	if errors.Is(err, fs.ErrNotExist) {
		return Login{}, fmt.Errorf("no login for cell %s: run hoard login", cell)
	}
	return l, err
}

// Logout forgets cell's login (the default one if cell is ""); error if none.
// Forgetting the default login leaves no default.
func Logout(base, cell string) error {
	def, err := defaultCell(base)
	if err != nil {
		return err
	}
	if cell == "" {
		if cell = def; cell == "" {
			return errors.New("no default login to forget: name the cell")
		}
	}
	if err := checkName("cell", cell); err != nil {
		return err
	}
	dir := filepath.Join(base, cellsDir, cell)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no login for cell %s", cell)
	}
	// The token first, so a failure half-way leaves no usable login.
	if err := os.Remove(filepath.Join(dir, tokenFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if cell == def {
		if err := os.Remove(filepath.Join(base, defaultFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Package dirs checks the directories hoard is told to keep its state in,
// so that a bad one is refused at once with a message that names it.
package dirs

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
)

// Ensure accepts an existing writable directory, or creates a missing one
// (with its parents when parents is set, else only if its parent exists).
// what names the directory's role in the error, e.g. "cache directory".
func Ensure(what, dir string, parents bool) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		mkdir := os.Mkdir
		if parents {
			mkdir = os.MkdirAll
		}
		if err := mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("%s %s: cannot create: %w", what, dir, unwrap(err))
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s %s: not a directory", what, dir)
	}
	// A probe, not access(2): root passes access checks on read-only mounts.
	probe, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("%s %s: not writable: %w", what, dir, unwrap(err))
	}
	probe.Close()
	return os.Remove(probe.Name())
}

// unwrap drops a *PathError's repetition of the path.
func unwrap(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// UserConfigDir is os.UserConfigDir, and where that finds no $HOME (a
// system service, which systemd starts without one), the XDG default
// under the home directory the user database gives: the same directory
// hoard login wrote to from the user's shell.
func UserConfigDir() (string, error) { return userDir(os.UserConfigDir, ".config") }

// UserCacheDir is UserConfigDir for os.UserCacheDir.
func UserCacheDir() (string, error) { return userDir(os.UserCacheDir, ".cache") }

func userDir(fromEnv func() (string, error), under string) (string, error) {
	d, err := fromEnv()
	if err == nil || os.Getenv("HOME") != "" {
		return d, err
	}
	u, uerr := user.Current()
	if uerr != nil || u.HomeDir == "" {
		return "", err
	}
	return filepath.Join(u.HomeDir, under), nil
}

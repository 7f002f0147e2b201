package cell

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// writeFile writes data to name atomically: a temporary file in the same
// directory, synced, then renamed over name, so a reader never sees half a
// key or certificate. With excl it refuses to replace an existing name.
func writeFile(name string, data []byte, perm fs.FileMode, excl bool) error {
	dir := filepath.Dir(name)
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed or linked
	// CreateTemp makes 0600; Chmod, not the umask, sets what we mean.
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if excl {
		// A hard link fails if name exists, where a rename would replace it:
		// two racing writers cannot both win.
		err := os.Link(tmp, name)
		if errors.Is(err, fs.ErrExist) {
			return &fs.PathError{Op: "create", Path: name, Err: fs.ErrExist}
		}
		if err != nil {
			// A file system without hard links: check, then rename.
			if _, serr := os.Lstat(name); serr == nil {
				return &fs.PathError{Op: "create", Path: name, Err: fs.ErrExist}
			}
			if err := os.Rename(tmp, name); err != nil {
				return err
			}
		}
	} else if err := os.Rename(tmp, name); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	return nil
}

// why is err without its operation and path, for messages that name the
// file themselves.
func why(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

func certPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func keyPEM(k ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCert parses the first certificate of a PEM file.
func parseCert(data []byte) (*x509.Certificate, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, errors.New("no PEM certificate in it")
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("bad certificate: %v", err)
		}
		return c, nil
	}
}

// parseKey parses a PEM PKCS#8 Ed25519 private key.
func parseKey(data []byte) (ed25519.PrivateKey, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM private key (PRIVATE KEY) in it")
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("bad private key: %v", err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an Ed25519 key", k)
	}
	return ek, nil
}

// readCert reads and parses a certificate file, its errors naming what
// as given (a file name, or a path).
func readCert(file, what string) (*x509.Certificate, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", what, why(err))
	}
	c, err := parseCert(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", what, err)
	}
	return c, nil
}

func readKey(file, what string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", what, why(err))
	}
	k, err := parseKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", what, err)
	}
	return k, nil
}

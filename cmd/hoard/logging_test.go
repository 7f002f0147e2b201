package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/hoardfs/hoard/internal/poll"
)

// A log file is rotated at its size, old ones compressed, only as many
// kept as asked for.
func TestLogFileRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "server.log")
	flags := pflag.NewFlagSet("server", pflag.ContinueOnError)
	logFlags(flags, "")
	flags.Parse([]string{"--log-max-size", "1", "--log-backups", "1"})
	lf, err := openLog(flags, path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	line := []byte(strings.Repeat("x", 1023) + "\n")
	for range 2500 { // 2.5 MB: two rotations
		if _, err := lf.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	var old []string
	if !poll.Until(10*time.Second, func() bool {
		old, _ = filepath.Glob(filepath.Join(dir, "server-*"))
		return len(old) == 1 && strings.HasSuffix(old[0], ".log.gz")
	}) {
		t.Fatalf("rotated logs: %v, want one compressed", old)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() > 1<<20 || fi.Size() == 0 {
		t.Fatalf("the log being written: %v %v", fi, err)
	}
}

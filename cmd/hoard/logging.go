package main

import (
	"bufio"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/hoardfs/hoard/lograte"
)

// closeLog flushes and closes the log file, if there is one: the last
// thing the process does.
var closeLog = func() {}

// logFlags adds --logfile, with usage, and the flags of its rotation.
func logFlags(f *pflag.FlagSet, usage string) {
	f.String("logfile", "", usage)
	f.Int("log-max-size", 10, "with a log file: start a new one when it reaches this many megabytes, compressing the old one")
	f.Int("log-backups", 5, "with a log file: how many old ones to keep (0: all)")
}

// setupLogging makes slog's default logger what cmd's flags ask for: a
// level, and stderr or a log file rotated by size. On stderr taken by
// journald (JOURNAL_STREAM), records carry no time: the journal stamps
// them.
func setupLogging(cmd *cobra.Command) error {
	lvl, _ := cmd.Flags().GetString("log-level")
	var l slog.Level
	if err := l.UnmarshalText([]byte(lvl)); err != nil {
		return usagef("--log-level %q: want debug, info, warn or error", lvl)
	}
	opts := &slog.HandlerOptions{Level: l}
	var out io.Writer = os.Stderr
	path, _ := cmd.Flags().GetString("logfile")
	if d, _ := cmd.Flags().GetBool("daemon"); d && os.Getenv("HOARD_DAEMONIZED") == "" {
		path = "" // the daemon writes it
	}
	if path != "" {
		lf, err := openLog(cmd.Flags(), path, os.Getenv("HOARD_DAEMONIZED") != "")
		if err != nil {
			return err
		}
		out = lf
		// A crash (a panic, a fatal error of the runtime) says why in the
		// log too, not only on a stderr nobody reads; after a rotation, in
		// the file that was the log at the start.
		if cf, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
			debug.SetCrashOutput(cf, debug.CrashOptions{})
			cf.Close() // SetCrashOutput keeps a copy of its own
		}
	} else if ok, _ := journal.StderrIsJournalStream(); ok {
		opts.ReplaceAttr = dropTime
	}
	logs = lograte.New(slog.NewTextHandler(out, opts), logInterval, 5)
	slog.SetDefault(slog.New(logs))
	go func() {
		for range time.Tick(logInterval) {
			logs.Tick()
		}
	}()
	return nil
}

func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

// openLog opens the log file path, rotated as flags say. A daemon
// (daemon: its stdout and stderr are that file) also sends what is
// written to os.Stderr (the FUSE trace, its last error) through it, and
// keeps descriptors 1 and 2, where the runtime writes a panic's trace,
// on the file being written.
func openLog(flags *pflag.FlagSet, path string, daemon bool) (*logFile, error) {
	size, _ := flags.GetInt("log-max-size")
	backups, _ := flags.GetInt("log-backups")
	if size < 1 {
		return nil, usagef("--log-max-size %d: want 1 or more (megabytes)", size)
	}
	if backups < 0 {
		return nil, usagef("--log-backups %d: want 0 (keep all) or more", backups)
	}
	// lumberjack opens the file at the first record: one it cannot
	// write must be told now, not lost then.
	os.MkdirAll(filepath.Dir(path), 0o755)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, usagef("--logfile %s: %v", path, err)
	}
	f.Close()
	lf := &logFile{lj: &lumberjack.Logger{Filename: path, MaxSize: size, MaxBackups: backups, Compress: true},
		max: int64(size) << 20, size: -1, follow: daemon}
	closeLog = func() { lf.lj.Close() }
	if !daemon {
		return lf, nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	os.Stderr = w
	done := make(chan struct{})
	go func() {
		defer close(done)
		br := bufio.NewReader(r)
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 {
				lf.Write(line)
			}
			if err != nil {
				return
			}
		}
	}()
	closeLog = func() {
		w.Close()
		<-done
		lf.lj.Close()
	}
	return lf, nil
}

// logFile is a log file that lumberjack rotates by size.
type logFile struct {
	lj  *lumberjack.Logger
	max int64

	mu sync.Mutex
	// size is at least the file's size (lumberjack counts only its own
	// writes); -1 before the first write.
	size int64
	// follow: keep descriptors 1 and 2 on the file being written.
	follow bool
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size < 0 {
		l.size = fileSize(l.lj.Filename)
	}
	full := l.size+int64(len(p)) >= l.max
	n, err := l.lj.Write(p)
	l.size += int64(n)
	if full { // lumberjack may have started a new file
		l.size = fileSize(l.lj.Filename)
		if l.follow {
			l.redirect()
		}
	}
	return n, err
}

func fileSize(path string) int64 {
	if fi, err := os.Stat(path); err == nil {
		return fi.Size()
	}
	return 0
}

// redirect points descriptors 1 and 2 at the file being written, if a
// rotation left them on the old one (soon compressed and removed).
func (l *logFile) redirect() {
	var cur, now unix.Stat_t
	if unix.Fstat(2, &cur) != nil || unix.Stat(l.lj.Filename, &now) != nil || cur.Dev == now.Dev && cur.Ino == now.Ino {
		return
	}
	f, err := os.OpenFile(l.lj.Filename, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	defer f.Close()
	unix.Dup3(int(f.Fd()), 1, 0)
	unix.Dup3(int(f.Fd()), 2, 0)
}

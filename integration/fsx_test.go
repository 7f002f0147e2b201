package integration

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/fsx"
	"github.com/hoardfs/hoard/internal/testkit"
)

// fsxFile is the size of the file the model checker works on: larger than
// the mount's cache, so that reads fetch and read-ahead runs under writes
// and truncations.
const fsxFile = 16 << 20

// fsxBudget is how long each mode runs: short in make test, a fifth of
// the soak's time under make soak (HOARD_FSX overrides both), and the seed.
func fsxBudget(t *testing.T) (time.Duration, uint64) {
	d := 15 * time.Second
	if soak, ok := envDuration(t, "HOARD_SOAK"); ok {
		d = soak / 5
	}
	if v, ok := envDuration(t, "HOARD_FSX"); ok {
		d = v
	}
	return d, envSeed(t, "HOARD_FSX_SEED")
}

// envDuration is the duration in environment variable name, if set.
func envDuration(t *testing.T, name string) (time.Duration, bool) {
	s := os.Getenv(name)
	if s == "" {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return d, true
}

// envSeed is the seed in environment variable name, or a new one.
func envSeed(t *testing.T, name string) uint64 {
	s := os.Getenv(name)
	if s == "" {
		return uint64(time.Now().UnixNano())
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return v
}

// TestFsxModel runs random pread, pwrite, ftruncate, fallocate, fsync,
// mapped reads, reopens and remounts on one 16 MiB file whose cache is
// half the file, comparing every read and every size with an in-memory
// model, and at the end the server's copy: through the library, then
// through a mount with delegations, without, through a proxy, with a
// second mount reading the file throughout, and over io_uring.
func TestFsxModel(t *testing.T) {
	needFuse(t)
	budget, seed := fsxBudget(t)
	for i, mode := range []string{"library", "delegations", "no-delegations", "proxy", "second-reader", "io_uring"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "io_uring" {
				needURing(t)
			}
			seed := seed + uint64(i)
			t.Logf("HOARD_FSX_SEED=%d HOARD_FSX=%v (replay with these; the subtests add 0..5)", seed-uint64(i), budget)
			srv := startServer(t, t.TempDir())
			to := srv
			if mode == "proxy" {
				to = startProxy(t, srv, t.TempDir())
			}
			initial := testkit.Pattern(fsxFile, 7)
			lib := dial(t, srv.addr, "mem", 64<<20)
			testkit.Create(t, lib, "/fsx", initial).Close()
			if mode == "library" {
				c := dial(t, srv.addr, t.TempDir(), 8<<20)
				cfg := fsx.Config{Seed: seed, Present: true, MaxSize: fsxFile, MaxLen: 1 << 20, For: budget,
					Open: func() (fsx.File, error) {
						f, err := c.Open("/fsx", os.O_RDWR, 0)
						return libFile{f}, err
					}}
				res, err := fsx.Run(cfg, initial)
				if err != nil {
					t.Fatal(err)
				}
				checkServerHolds(t, lib, res)
				return
			}
			var args []string
			if mode == "no-delegations" {
				args = append(args, "--no-delegations")
			}
			if mode == "io_uring" {
				args = append(args, "--io-uring")
			}
			m := startMount(t, to, t.TempDir(), append(args, "--cache-size", "8M")...)
			var reader sync.WaitGroup
			var stop atomic.Bool
			var readErrs atomic.Int64
			var firstErr atomic.Value
			if mode == "second-reader" {
				r := startMount(t, srv, t.TempDir(), "--cache-size", "8M")
				reader.Add(1)
				go func() {
					defer reader.Done()
					buf := make([]byte, 1<<20)
					for !stop.Load() {
						f, err := os.Open(r.path("fsx"))
						if err == nil {
							for err == nil {
								_, err = f.Read(buf)
							}
							f.Close()
						}
						if err != nil && err.Error() != "EOF" {
							if readErrs.Add(1) == 1 {
								firstErr.Store(err)
							}
						}
					}
				}()
			}
			cfg := fsx.Config{Seed: seed, Present: true, MaxSize: fsxFile, MaxLen: 1 << 20, For: budget,
				Weights: map[fsx.Op]int{fsx.Read: 33, fsx.Write: 28, fsx.Truncate: 24, fsx.Sync: 6,
					fsx.Allocate: 4, fsx.MapRead: 3, fsx.Reopen: 2, fsx.Remount: 1},
				Open: func() (fsx.File, error) { return fsx.OpenOS(m.path("fsx")) },
				Remount: func() error {
					m.stop()
					m.start(to)
					return nil
				},
			}
			if mode == "second-reader" {
				cfg.Remount = nil
			}
			res, err := fsx.Run(cfg, initial)
			stop.Store(true)
			reader.Wait()
			if err != nil {
				t.Fatal(err)
			}
			if n := readErrs.Load(); n > 0 {
				t.Errorf("the second mount's reader failed %d times, first: %v", n, firstErr.Load())
			}
			// What the server holds after a last close and unmount.
			m.stop()
			checkServerHolds(t, lib, res)
		})
	}
}

// checkServerHolds compares the server's copy of /fsx with the model.
func checkServerHolds(t *testing.T, lib *pathfs.FS, res fsx.Result) {
	t.Helper()
	got := testkit.ReadFile(t, lib, "/fsx")
	if !bytes.Equal(got, res.Final) {
		t.Fatalf("the server holds %d bytes unlike the model's %d (first difference at %d)",
			len(got), len(res.Final), fsx.FirstDiff(got, res.Final))
	}
	t.Log(res)
}

// libFile is a library client's open file as the checker's File.
type libFile struct{ *client.File }

func (f libFile) Size() (int64, error) {
	st, err := f.Stat()
	return int64(st.Size), err
}

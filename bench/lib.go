package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
)

// libBench measures the library: a large file cold and warm, bypassed
// writes, and small cached files.
func libBench(e *harness.Env) error {
	addr, serverPID, scratch := e.Addr, e.ServerPID, e.Scratch
	// The large file: written once locally and once into hoard.
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	local := filepath.Join(scratch, "local.big")
	if err := harness.WriteLocal(local, data, e.Size); err != nil {
		return err
	}
	w, err := pathfs.Dial(client.Options{Server: addr, CacheSize: 64 << 20})
	if err != nil {
		return err
	}
	if err := harness.WriteRemote(w, "/big", data, e.Size); err != nil {
		return err
	}

	fmt.Printf("\n## Large file (%s, %s reads)\n\n", harness.Human(e.Size), harness.Human(int64(e.ReadSize)))
	fmt.Println("| measurement | hoard | baseline | ratio |")
	fmt.Println("|---|---|---|---|")

	// Cold fetch vs raw TCP: into memory, and into a file on the same disk
	// (a cold fetch into a disk cache must write the bytes too).
	// Each timed phase starts with no dirty pages in flight, so that
	// writeback of an earlier phase does not slow a later one.
	syscall.Sync()
	tcpMem, err := e.RawTCP(local, e.Size, "")
	if err != nil {
		return err
	}
	syscall.Sync()
	tcpDisk, err := e.RawTCP(local, e.Size, filepath.Join(scratch, "tcp.copy"))
	if err != nil {
		return err
	}
	// Best of three, alternating, each with a fresh client and cache.
	var cold, coldMem, serverCPU, clientCPU time.Duration
	var c *pathfs.FS
	for i := 0; i < 3; i++ {
		// alwaysCache: these measure the cache's own path, not auto's choice.
		m, err := pathfs.Dial(client.Options{Server: addr, CacheSize: e.Size + 256<<20, AutoMin: alwaysCache, DataStreams: *streams})
		if err != nil {
			return err
		}
		syscall.Sync()
		d, err := e.ReadRemote(m, "/big", e.Size)
		if err != nil {
			return err
		}
		m.Close()
		coldMem = harness.MinDur(coldMem, d)
		if c != nil {
			c.Close()
		}
		cacheDir := filepath.Join(scratch, fmt.Sprintf("cache%d", i))
		if c, err = pathfs.Dial(client.Options{Server: addr, CacheDir: cacheDir, CacheSize: e.Size + 256<<20, AutoMin: alwaysCache, DataStreams: *streams}); err != nil {
			return err
		}
		syscall.Sync()
		if *profile != "" && i == 0 {
			pf, err := os.Create(*profile)
			if err != nil {
				return err
			}
			pprof.StartCPUProfile(pf)
		}
		s0, c0 := harness.ProcCPU(serverPID), harness.ProcCPU(os.Getpid())
		d, err = e.ReadRemote(c, "/big", e.Size)
		pprof.StopCPUProfile()
		if err != nil {
			return err
		}
		if d < cold || cold == 0 {
			serverCPU, clientCPU = harness.ProcCPU(serverPID)-s0, harness.ProcCPU(os.Getpid())-c0
		}
		cold = harness.MinDur(cold, d)
	}
	fmt.Printf("| cold fetch, memory cache (MB/s) | %.0f | %.0f raw TCP into memory | %.2f× |\n", harness.MBps(e.Size, coldMem), harness.MBps(e.Size, tcpMem), tcpMem.Seconds()/coldMem.Seconds())
	fmt.Printf("| cold fetch, disk cache (MB/s) | %.0f | %.0f raw TCP into memory | %.2f× |\n", harness.MBps(e.Size, cold), harness.MBps(e.Size, tcpMem), tcpMem.Seconds()/cold.Seconds())
	fmt.Printf("| cold fetch, disk cache (MB/s) | %.0f | %.0f raw TCP into a file on the same disk | %.2f× |\n", harness.MBps(e.Size, cold), harness.MBps(e.Size, tcpDisk), tcpDisk.Seconds()/cold.Seconds())

	// Warm re-read vs local file (both from the page cache).
	e.ReadLocal(local, e.Size)
	var bestLocal, bestWarm time.Duration
	for i := 0; i < 5; i++ {
		l, err := e.ReadLocal(local, e.Size)
		if err != nil {
			return err
		}
		h, err := e.ReadRemote(c, "/big", e.Size)
		if err != nil {
			return err
		}
		bestLocal, bestWarm = harness.MinDur(bestLocal, l), harness.MinDur(bestWarm, h)
	}
	st := c.Client().Stats()
	fmt.Printf("| warm re-read (MB/s) | %.0f | %.0f local file | %.2f× |\n", harness.MBps(e.Size, bestWarm), harness.MBps(e.Size, bestLocal), bestLocal.Seconds()/bestWarm.Seconds())
	// A bypassed write (its runs kept aside at the server as one stage,
	// published at fsync) against a local write, both made durable: best
	// of three, alternating.
	var bestLocalW, bestBypassW time.Duration
	for i := 0; i < 3; i++ {
		syscall.Sync()
		l, err := timeDurableWrite(func() (durableFile, error) { return os.Create(filepath.Join(scratch, "local.w")) }, data, e.Size)
		if err != nil {
			return err
		}
		syscall.Sync()
		h, err := timeDurableWrite(func() (durableFile, error) { return w.Create("/__bypassed") }, data, e.Size)
		if err != nil {
			return err
		}
		bestLocalW, bestBypassW = harness.MinDur(bestLocalW, l), harness.MinDur(bestBypassW, h)
	}
	os.Remove(filepath.Join(scratch, "local.w"))
	fmt.Printf("| bypassed write, fsync'd (MB/s) | %.0f | %.0f local file | %.2f× |\n", harness.MBps(e.Size, bestBypassW), harness.MBps(e.Size, bestLocalW), bestLocalW.Seconds()/bestBypassW.Seconds())
	fmt.Printf("\n(best disk-cache cold fetch: %.2f s wall, server %.2f s CPU, client %.2f s CPU)\n", cold.Seconds(), serverCPU.Seconds(), clientCPU.Seconds())
	c.Close()
	if st.BytesFetched != e.Size {
		fmt.Printf("\n(note: %d bytes fetched for a %d-byte file)\n", st.BytesFetched, e.Size)
	}
	os.Remove(local)

	return smallFiles(e, w)
}

// smallFiles measures operations on small files cached, against the
// local file system's.
func smallFiles(e *harness.Env, w *pathfs.FS) error {
	addr, scratch := e.Addr, e.Scratch
	n, size := e.Files, e.Small
	fmt.Printf("\n## %d small files of %s, cached (per-operation latency)\n\n", n, harness.Human(int64(size)))
	localDir := filepath.Join(scratch, "small")
	os.MkdirAll(localDir, 0o755)
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	if err := w.Mkdir("/small", 0o755); err != nil {
		return err
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("d%02d/f%05d", i%100, i)
		if i < 100 {
			os.Mkdir(filepath.Join(localDir, fmt.Sprintf("d%02d", i)), 0o755)
			if err := w.Mkdir("/small/"+fmt.Sprintf("d%02d", i), 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(localDir, names[i]), buf, 0o644); err != nil {
			return err
		}
		if err := harness.WriteRemote(w, "/small/"+names[i], buf, int64(size)); err != nil {
			return err
		}
	}
	c, err := pathfs.Dial(client.Options{Server: addr, CacheDir: filepath.Join(scratch, "cache-small"), CacheSize: 1 << 30})
	if err != nil {
		return err
	}
	defer c.Close()
	p := make([]byte, size)
	// Warm both.
	for _, name := range names {
		f, err := c.Open("/small/"+name, os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		f.ReadAt(p, 0)
		f.Close()
		os.ReadFile(filepath.Join(localDir, name))
	}
	fetched := c.Client().Stats().BytesFetched
	rpcs := c.Client().Stats().RPCs
	type op struct {
		name   string
		hoard  func(string) error
		native func(string) error
	}
	ops := []op{
		{"stat", func(n string) error { _, err := c.Stat("/small/" + n); return err },
			func(n string) error { _, err := os.Stat(filepath.Join(localDir, n)); return err }},
		{"open+close", func(n string) error {
			f, err := c.Open("/small/"+n, os.O_RDONLY, 0)
			if err != nil {
				return err
			}
			return f.Close()
		}, func(n string) error {
			f, err := os.Open(filepath.Join(localDir, n))
			if err != nil {
				return err
			}
			return f.Close()
		}},
		{"open+read+close", func(n string) error {
			f, err := c.Open("/small/"+n, os.O_RDONLY, 0)
			if err != nil {
				return err
			}
			if _, err := f.ReadAt(p, 0); err != nil && err != io.EOF {
				return err
			}
			return f.Close()
		}, func(n string) error {
			f, err := os.Open(filepath.Join(localDir, n))
			if err != nil {
				return err
			}
			if _, err := f.ReadAt(p, 0); err != nil && err != io.EOF {
				return err
			}
			return f.Close()
		}},
	}
	fmt.Println("| operation | hoard (µs/op) | local FS (µs/op) | ratio (hoard/local) |")
	fmt.Println("|---|---|---|---|")
	for _, o := range ops {
		var bh, bl time.Duration
		for round := 0; round < 3; round++ {
			h, err := harness.TimeAll(names, o.hoard)
			if err != nil {
				return fmt.Errorf("%s: %w", o.name, err)
			}
			l, err := harness.TimeAll(names, o.native)
			if err != nil {
				return err
			}
			bh, bl = harness.MinDur(bh, h), harness.MinDur(bl, l)
		}
		us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(len(names)) }
		fmt.Printf("| %s | %.2f | %.2f | %.2f× |\n", o.name, us(bh), us(bl), bh.Seconds()/bl.Seconds())
	}
	st := c.Client().Stats()
	fmt.Printf("\n(cached phase: %d bytes fetched, %d RPCs across all operations above)\n", st.BytesFetched-fetched, st.RPCs-rpcs)
	return nil
}

// alwaysCache as Options.AutoMin turns auto's bypass of large files off.
const alwaysCache = 1 << 62

type durableFile interface {
	io.WriteCloser
	Sync() error
}

// timeDurableWrite times writing size bytes (data repeated) to the file
// create makes, an fsync and the close.
func timeDurableWrite(create func() (durableFile, error), data []byte, size int64) (time.Duration, error) {
	start := time.Now()
	f, err := create()
	if err != nil {
		return 0, err
	}
	if err := harness.Fill(f, data, size); err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		return 0, err
	}
	return time.Since(start), f.Close()
}

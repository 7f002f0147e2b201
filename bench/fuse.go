package main

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/hoardfs/hoard/bench/chart"
	"github.com/hoardfs/hoard/bench/harness"
)

// fuseBench measures the FUSE mount against the local file system on the
// same disk, with passthrough on and off (the passthrough table in docs/benchmarks.md).
func fuseBench(e *harness.Env) error {
	bin, addr, scratch := e.Bin, e.Addr, e.Scratch
	n, size := e.Files, e.Small
	big := e.Size
	local := filepath.Join(scratch, "fuse-local")
	os.MkdirAll(filepath.Join(local, "tree"), 0o755)
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*13 + i>>11)
	}
	if err := harness.WriteLocal(filepath.Join(local, "big"), data, big); err != nil {
		return err
	}
	small := make([]byte, size)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("tree/d%02d/f%05d", i%100, i)
		os.MkdirAll(filepath.Join(local, filepath.Dir(names[i])), 0o755)
		if err := os.WriteFile(filepath.Join(local, names[i]), small, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("\n## FUSE mount vs local file system (%s file, %d files of %s)\n\n", harness.Human(big), n, harness.Human(int64(size)))
	fmt.Println("| measurement | local | hoard, passthrough | ratio | hoard, page cache | ratio |")
	fmt.Println("|---|---|---|---|---|---|")

	type result struct{ pt, pc time.Duration }
	rows := []struct {
		name  string
		unit  string
		local time.Duration
		r     result
	}{
		{name: "warm sequential read, 1 MiB reads (s)"},
		{name: "warm 4 KiB random reads, 20,000 (s)"},
		{name: "open+read+close of each small file (s)"},
		{name: "stat of each small file (s)"},
		{name: "cold find | xargs cat (s)"},
		{name: "warm find | xargs cat (s)"},
	}
	measure := func(root string) ([]time.Duration, error) {
		var out []time.Duration
		bigPath := filepath.Join(root, "big")
		harness.ReadFile(bigPath)
		seq, err := harness.BestOf(3, func() error { _, err := harness.ReadFile(bigPath); return err })
		if err != nil {
			return nil, err
		}
		rnd, err := harness.BestOf(3, func() error { return randomReads(bigPath, big, 20000) })
		if err != nil {
			return nil, err
		}
		orc, err := harness.BestOf(3, func() error {
			for _, name := range names {
				if _, err := harness.ReadFile(filepath.Join(root, name)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		st, err := harness.BestOf(3, func() error {
			for _, name := range names {
				if _, err := os.Stat(filepath.Join(root, name)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		warm, err := harness.BestOf(3, func() error { return harness.FindCat(context.Background(), filepath.Join(root, "tree")) })
		if err != nil {
			return nil, err
		}
		return append(out, seq, rnd, orc, st, 0, warm), nil
	}
	l, err := measure(local)
	if err != nil {
		return err
	}
	harness.DropCaches()
	lcold, err := harness.Timed(func() error { return harness.FindCat(context.Background(), filepath.Join(local, "tree")) })
	if err != nil {
		return err
	}
	l[4] = lcold
	for i := range rows {
		rows[i].local = l[i]
	}
	for _, pt := range []bool{true, false} {
		mnt := filepath.Join(scratch, fmt.Sprintf("mnt-%v", pt))
		cache := filepath.Join(scratch, fmt.Sprintf("fcache-%v", pt))
		os.MkdirAll(mnt, 0o755)
		args := []string{"mount", "--insecure", "--server", addr, "--cache", cache, "--cache-size", fmt.Sprint(big + 2<<30), "--daemon", fmt.Sprintf("--passthrough=%v", pt), mnt}
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("mount: %v: %s", err, out)
		}
		stop := func() { exec.Command(bin, "umount", mnt).Run() }
		if pt {
			// Fill the cell through the first mount.
			if err := exec.Command("cp", "-a", filepath.Join(local, "big"), filepath.Join(local, "tree"), mnt).Run(); err != nil {
				stop()
				return err
			}
			stop()
			// Remount with an empty cache for the cold run.
			os.RemoveAll(cache)
			if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
				return fmt.Errorf("mount: %v: %s", err, out)
			}
		}
		harness.DropCaches()
		cold, err := harness.Timed(func() error { return harness.FindCat(context.Background(), filepath.Join(mnt, "tree")) })
		if err != nil {
			stop()
			return err
		}
		h, err := measure(mnt)
		stop()
		if err != nil {
			return err
		}
		h[4] = cold
		for i := range rows {
			if pt {
				rows[i].r.pt = h[i]
			} else {
				rows[i].r.pc = h[i]
			}
		}
	}
	for _, r := range rows {
		fmt.Printf("| %s | %.3f | %.3f | %.2f× | %.3f | %.2f× |\n", r.name, r.local.Seconds(), r.r.pt.Seconds(),
			r.r.pt.Seconds()/r.local.Seconds(), r.r.pc.Seconds(), r.r.pc.Seconds()/r.local.Seconds())
	}
	fmt.Println("\n(ratios are hoard's time over the local file system's: lower is better)")
	p := chart.Panel{YLabel: "time ÷ local's (lower is better)", Ref: 1, RefName: "local",
		Categories: []string{"sequential read", "4 KiB random", "open+read+close", "stat", "cold find|cat", "warm find|cat"}}
	for _, pt := range []bool{true, false} {
		s := chart.Series{Name: "hoard, page cache"}
		if pt {
			s.Name = "hoard, passthrough"
		}
		for _, r := range rows {
			h := r.r.pc
			if pt {
				h = r.r.pt
			}
			s.Y = append(s.Y, h.Seconds()/r.local.Seconds())
		}
		p.Series = append(p.Series, s)
	}
	return e.Figure("mount", &chart.Chart{Title: fmt.Sprintf("The mount against the local disk: a %s file, %d files of %s, cached", harness.Human(big), n, harness.Human(int64(size))), Panels: []chart.Panel{p}})
}

func randomReads(path string, size int64, count int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	rng := rand.New(rand.NewSource(1))
	p := make([]byte, 4096)
	for i := 0; i < count; i++ {
		if _, err := f.ReadAt(p, rng.Int63n(size/4096)*4096); err != nil && err != io.EOF {
			return err
		}
	}
	return nil
}

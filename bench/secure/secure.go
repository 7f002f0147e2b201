// Package secure is bench's secure part: what TLS, tokens and ACLs cost
// against --insecure.
package secure

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/bench/postmark"
	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/datapath"
)

// Run measures what security costs, in one run: a server with its cell
// (TLS 1.3 with encryption on both channels, a user's token checked
// against the ACLs on every request) against one run --insecure (plain
// TCP, nobody checked), on the same data, each with its own mount, and
// Debian's postmark running pm on each.
func Run(e *harness.Env, pm postmark.Workload) error {
	bin, scratch, size := e.Bin, e.Scratch, e.Size
	insAddr, insPID, stopIns, err := harness.StartServer(bin, filepath.Join(scratch, "insecure"))
	if err != nil {
		return err
	}
	defer stopIns()
	secData := filepath.Join(scratch, "secure")
	secAddr, secPID, stopSec, err := harness.StartHoard(bin, "server", "--data", secData)
	if err != nil {
		return err
	}
	defer stopSec()
	cellDir := filepath.Join(secData, "cell")
	ca, err := cell.LoadCA(filepath.Join(cellDir, cell.CAFile))
	if err != nil {
		return err
	}
	// A user, not an admin: admins skip the ACL checks.
	out, err := exec.Command(bin, "token", "issue", "--cell", cellDir, "--user", "bench", "--uid", fmt.Sprint(os.Getuid())).Output()
	if err != nil {
		return fmt.Errorf("token issue: %v", err)
	}
	token := strings.TrimSpace(string(out))
	tokFile := filepath.Join(scratch, "bench.token")
	if err := os.WriteFile(tokFile, []byte(token), 0o600); err != nil {
		return err
	}
	admin, err := os.ReadFile(filepath.Join(cellDir, cell.AdminTokenFile))
	if err != nil {
		return err
	}
	ac, err := pathfs.Dial(client.Options{Server: secAddr, TLS: cell.UserTLS(ca), Token: strings.TrimSpace(string(admin)), CacheSize: 16 << 20})
	if err != nil {
		return err
	}
	_, err = ac.Admin().SetACL("/", "bench", access.All&^access.Administer)
	ac.Close()
	if err != nil {
		return err
	}

	type side struct {
		name  string
		addr  string
		pid   int
		opts  client.Options
		mount []string
	}
	sides := []side{
		{"insecure", insAddr, insPID, client.Options{Server: insAddr}, nil},
		{"secure", secAddr, secPID, client.Options{Server: secAddr, TLS: cell.UserTLS(ca), Token: token},
			[]string{"--ca", filepath.Join(cellDir, cell.CAFile), "--token", tokFile}},
	}
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*13 + i>>11)
	}
	local := filepath.Join(scratch, "local.big")
	if err := harness.WriteLocal(local, data, size); err != nil {
		return err
	}
	syscall.Sync()
	tcp, err := e.RawTCP(local, size, "")
	if err != nil {
		return err
	}
	var res [2]secResult
	const files = 2000
	for i, s := range sides {
		r := &res[i]
		o := s.opts
		o.CacheSize = 64 << 20
		w, err := pathfs.Dial(o)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if err := harness.WriteRemote(w, "/big", data, size); err != nil {
			return err
		}
		w.Close()
		// Cold, bypassing the cache: every byte crosses the data channel.
		o.BypassThreshold = 1
		c, err := pathfs.Dial(o)
		if err != nil {
			return err
		}
		syscall.Sync()
		srv0, cli0 := harness.ProcCPU(s.pid), selfCPU()
		if r.cold, err = e.ReadRemote(c, "/big", size); err != nil {
			return err
		}
		r.srvCPU, r.cliCPU = harness.ProcCPU(s.pid)-srv0, selfCPU()-cli0
		c.Close()

		mnt := filepath.Join(scratch, "mnt-"+s.name)
		unmount, err := harness.MountCell(bin, s.addr, mnt, filepath.Join(scratch, "cache-"+s.name), append([]string{"--cache-size", fmt.Sprint(size + 1<<30)}, s.mount...)...)
		if err != nil {
			return err
		}
		big := filepath.Join(mnt, "big")
		if _, err := harness.ReadFile(big); err != nil { // fills the cache
			unmount()
			return err
		}
		if r.warm, err = harness.BestOf(3, func() error { _, err := harness.ReadFile(big); return err }); err != nil {
			unmount()
			return err
		}
		if err := latencies(filepath.Join(mnt, "lat"), files, r); err != nil {
			unmount()
			return err
		}
		pmDir := filepath.Join(mnt, "pm")
		os.MkdirAll(pmDir, 0o755)
		run, err := postmark.Debian(context.Background(), pmDir, pm, postmark.High)
		unmount()
		if err != nil {
			return err
		}
		r.pm = run.TPS
	}
	ins, sec := res[0], res[1]
	gib := float64(size) / (1 << 30)
	fmt.Printf("\n## Security on vs --insecure (%s file, %d small files, postmark %d files / %d transactions)\n\n", harness.Human(size), files, pm.Files, pm.Tx)
	fmt.Println("| measurement | --insecure | secure (TLS 1.3, token, ACLs) | secure / insecure |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| cold bypassed read, library | %.0f MB/s (%.2f× raw TCP) | %.0f MB/s (%.2f× raw TCP) | %.2f× |\n",
		harness.MBps(size, ins.cold), tcp.Seconds()/ins.cold.Seconds(), harness.MBps(size, sec.cold), tcp.Seconds()/sec.cold.Seconds(), ins.cold.Seconds()/sec.cold.Seconds())
	fmt.Printf("| server CPU per GiB, cold read | %.2f s | %.2f s | %.2f× |\n", ins.srvCPU.Seconds()/gib, sec.srvCPU.Seconds()/gib, per(sec.srvCPU.Seconds(), ins.srvCPU.Seconds()))
	fmt.Printf("| client CPU per GiB, cold read | %.2f s | %.2f s | %.2f× |\n", ins.cliCPU.Seconds()/gib, sec.cliCPU.Seconds()/gib, per(sec.cliCPU.Seconds(), ins.cliCPU.Seconds()))
	fmt.Printf("| warm cached read, mount | %.0f MB/s | %.0f MB/s | %.3f× |\n", harness.MBps(size, ins.warm), harness.MBps(size, sec.warm), ins.warm.Seconds()/sec.warm.Seconds())
	fmt.Printf("| create + close, mount | %.0f µs | %.0f µs | %.2f× |\n", ins.create, sec.create, per(sec.create, ins.create))
	fmt.Printf("| stat, mount, warm | %.1f µs | %.1f µs | %.2f× |\n", ins.stat, sec.stat, per(sec.stat, ins.stat))
	fmt.Printf("| open + close, mount, warm | %.1f µs | %.1f µs | %.2f× |\n", ins.openUs, sec.openUs, per(sec.openUs, ins.openUs))
	fmt.Printf("| postmark, mount | %.0f tx/s | %.0f tx/s | %.2f× |\n", ins.pm, sec.pm, per(sec.pm, ins.pm))
	fmt.Printf("\nRaw loopback TCP: %.0f MB/s. Ratios of times and CPU: above 1 costs more; of rates: below 1 is slower.\n", harness.MBps(size, tcp))
	fmt.Println("\nWhat a data byte costs on one core, by what protects it (an integrity-only level would need a MAC over every byte):")
	fmt.Println()
	fmt.Println("| per byte | MB/s, one core |")
	fmt.Println("|---|---|")
	for _, p := range protections() {
		fmt.Printf("| %s | %.0f |\n", p.name, p.rate())
	}
	return nil
}

// protection is a way of protecting a run of bytes, timed over 1 GiB.
type protection struct {
	name string
	run  func(p []byte)
}

func protections() []protection {
	blk, _ := aes.NewCipher(make([]byte, 16))
	gcm, _ := cipher.NewGCM(blk)
	nonce, sealed := make([]byte, gcm.NonceSize()), make([]byte, 0, 1<<20+gcm.Overhead())
	mac := hmac.New(sha256.New, make([]byte, 32))
	return []protection{
		{"AES-128-GCM seal (privacy: TLS 1.3 on CPUs with AES instructions)", func(p []byte) { gcm.Seal(sealed[:0], nonce, p, nil) }},
		{"HMAC-SHA256 (integrity without privacy)", func(p []byte) { mac.Reset(); mac.Write(p); mac.Sum(nil) }},
		{"CRC32C (--insecure: corruption caught, nothing authenticated)", func(p []byte) { datapath.Checksum(0, p) }},
	}
}

func (p protection) rate() float64 {
	buf := make([]byte, 1<<20)
	start := time.Now()
	for range 1024 {
		p.run(buf)
	}
	return harness.MBps(1<<30, time.Since(start))
}

// secResult is one side's figures: times of the cold and warm reads,
// the CPU the cold one took on both sides, mean microseconds of the
// metadata operations, postmark's transactions per second.
type secResult struct {
	cold, warm           time.Duration
	srvCPU, cliCPU       time.Duration
	create, stat, openUs float64
	pm                   float64
}

// latencies times creating n empty files in dir, then stat and open of
// each (warm: the second pass), in mean microseconds per file.
func latencies(dir string, n int, r *secResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	names := make([]string, n)
	for i := range names {
		names[i] = filepath.Join(dir, fmt.Sprintf("f%05d", i))
	}
	each := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	d, err := harness.TimeAll(names, func(p string) error {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		return f.Close()
	})
	if err != nil {
		return err
	}
	r.create = each(d)
	stat := func(p string) error { _, err := os.Stat(p); return err }
	open := func(p string) error {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		return f.Close()
	}
	if _, err := harness.TimeAll(names, stat); err != nil {
		return err
	}
	if d, err = harness.TimeAll(names, stat); err != nil {
		return err
	}
	r.stat = each(d)
	if _, err := harness.TimeAll(names, open); err != nil {
		return err
	}
	if d, err = harness.TimeAll(names, open); err != nil {
		return err
	}
	r.openUs = each(d)
	return nil
}

// per is a/b, 0 if b was not measured.
func per(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// selfCPU is this process's user+system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

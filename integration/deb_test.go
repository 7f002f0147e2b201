package integration

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// make deb builds a Debian package of hoard (contrib/nfpm.yaml) that holds
// the binary, its mount helper's name, the systemd units, their defaults
// files, the man pages, the dashboard and the docs, with Debian's modes;
// its binary runs from the unpacked tree and says its version. Nothing
// is installed: the package is checked with dpkg-deb and unpacked into a
// temporary directory.
func TestDebPackage(t *testing.T) {
	if os.Getenv("HOARD_SKIP_DEB") != "" {
		t.Skip("HOARD_SKIP_DEB is set")
	}
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("no dpkg-deb to check the package with (Debian's dpkg)")
	}
	dist := t.TempDir()
	// make deb fetches and builds nfpm the first time.
	if out, err := exec.Command("make", "-s", "-C", "..", "deb", "DIST="+dist).CombinedOutput(); err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "hoard_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb made %v; want one hoard_*.deb", debs)
	}
	deb := debs[0]
	dpkgDeb := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("dpkg-deb", args...).Output()
		if err != nil {
			t.Fatalf("dpkg-deb %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}

	// The control file.
	arch := runtime.GOARCH
	if arch == "386" {
		arch = "i386"
	}
	info := dpkgDeb("--info", deb)
	control := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ": "); ok && !strings.Contains(k, " ") {
			control[k] = v
		}
	}
	for k, want := range map[string]string{"Package": "hoard", "Architecture": arch} {
		if control[k] != want {
			t.Errorf("%s: %q, want %q\n%s", k, control[k], want, info)
		}
	}
	if !slices.Contains(strings.Split(control["Depends"], ", "), "fuse3") {
		t.Errorf("Depends: %q, want fuse3", control["Depends"])
	}
	version := control["Version"]
	if !regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`).MatchString(version) {
		t.Errorf("Version %q is not a Debian version", version)
	}
	if filepath.Base(deb) != "hoard_"+version+"_"+arch+".deb" {
		t.Errorf("package file %s, want hoard_%s_%s.deb", filepath.Base(deb), version, arch)
	}
	for _, k := range []string{"Maintainer", "Description", "Homepage"} {
		if control[k] == "" {
			t.Errorf("no %s field:\n%s", k, info)
		}
	}
	conffiles := strings.Fields(dpkgDeb("--info", deb, "conffiles"))
	wantConf := []string{"/etc/default/hoard-mount", "/etc/default/hoard-proxy", "/etc/default/hoard-server"}
	if slices.Sort(conffiles); !slices.Equal(conffiles, wantConf) {
		t.Errorf("conffiles %v, want %v", conffiles, wantConf)
	}
	// Daemons that need their options first are left to the admin.
	if m := regexp.MustCompile(`systemctl\b.*\b(enable|start|restart)\b`).FindString(dpkgDeb("--info", deb, "postinst")); m != "" {
		t.Errorf("postinst starts or enables a unit: %q", m)
	}

	// What it holds, with which modes.
	units, _ := filepath.Glob(filepath.Join("..", "contrib", "systemd", "*.service"))
	if len(units) == 0 {
		t.Fatal("no units in contrib/systemd")
	}
	// The man pages are those its own hoard writes.
	root := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v\n%s", err, out)
	}
	hoard := filepath.Join(root, "usr", "bin", "hoard")
	manDir := t.TempDir()
	if out, err := exec.Command(hoard, "man", manDir).CombinedOutput(); err != nil {
		t.Fatalf("hoard man: %v\n%s", err, out)
	}
	pages, _ := filepath.Glob(filepath.Join(manDir, "*.1"))
	if len(pages) < 10 {
		t.Fatalf("hoard man wrote %d pages", len(pages))
	}
	const file, exe, link = "-rw-r--r--", "-rwxr-xr-x", "lrwxrwxrwx"
	want := map[string]string{
		"/usr/bin/hoard":                 exe,
		"/usr/sbin/mount.fuse.hoard":     link + " -> ../bin/hoard",
		"/usr/sbin/umount.fuse.hoard":    link + " -> ../bin/hoard",
		"/etc/default/hoard-server":      file,
		"/etc/default/hoard-proxy":       file,
		"/etc/default/hoard-mount":       file,
		"/usr/share/hoard/hoard.json":    file,
		"/usr/share/doc/hoard/README.md": file,
	}
	for _, u := range units {
		want["/usr/lib/systemd/system/"+filepath.Base(u)] = file
	}
	for _, p := range pages {
		want["/usr/share/man/man1/"+filepath.Base(p)+".gz"] = file
	}
	licenses, _ := filepath.Glob(filepath.Join("..", "LICENSE*"))
	for _, l := range licenses {
		want["/usr/share/doc/hoard/"+filepath.Base(l)] = file
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(dpkgDeb("--contents", deb)), "\n") {
		// -rw-r--r-- root/root 577 2026-11-26 18:54 ./usr/lib/...[ -> target]
		f := strings.Fields(line)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb --contents: %q", line)
		}
		if f[1] != "root/root" {
			t.Errorf("%s: owned by %s", f[5], f[1])
		}
		if strings.HasPrefix(f[0], "d") {
			if f[0] != "drwxr-xr-x" {
				t.Errorf("directory %s: mode %s", f[5], f[0])
			}
			continue
		}
		got[strings.TrimPrefix(f[5], ".")] = strings.Join(append(f[:1], f[6:]...), " ")
	}
	for path, mode := range want {
		if got[path] != mode {
			t.Errorf("%s: %q in the package, want %q", path, got[path], mode)
		}
	}
	for path, mode := range got {
		if _, ok := want[path]; !ok {
			t.Errorf("%s (%s) in the package, unexpected", path, mode)
		}
	}

	// Unpacked: the files are contrib's, the binary runs.
	same := func(inPackage, inRepo string) {
		t.Helper()
		a, err := os.ReadFile(filepath.Join(root, inPackage))
		if err != nil {
			t.Error(err)
			return
		}
		b, err := os.ReadFile(inRepo)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s", inPackage, inRepo)
		}
	}
	envFile := regexp.MustCompile(`(?m)^EnvironmentFile=-?(\S+)$`)
	for _, u := range units {
		same("/usr/lib/systemd/system/"+filepath.Base(u), u)
		b, _ := os.ReadFile(u)
		// Every defaults file a unit reads is shipped.
		for _, m := range envFile.FindAllStringSubmatch(string(b), -1) {
			if _, ok := want[m[1]]; !ok {
				t.Errorf("%s reads %s, which the package does not hold", filepath.Base(u), m[1])
			}
		}
	}
	for _, d := range []string{"hoard-server", "hoard-proxy", "hoard-mount"} {
		same("/etc/default/"+d, filepath.Join("..", "contrib", "default", d))
	}
	same("/usr/share/hoard/hoard.json", filepath.Join("..", "contrib", "grafana", "hoard.json"))
	same("/usr/share/doc/hoard/README.md", filepath.Join("..", "README.md"))
	for _, p := range []string{"hoard.1", "hoard-server.1", "hoard-mount.1"} {
		f, err := os.Open(filepath.Join(root, "usr", "share", "man", "man1", p+".gz"))
		if err != nil {
			t.Error(err)
			continue
		}
		zr, err := gzip.NewReader(f)
		var page []byte
		if err == nil {
			page, err = io.ReadAll(zr)
		}
		f.Close()
		if want, _ := os.ReadFile(filepath.Join(manDir, p)); err != nil || !bytes.Equal(page, want) {
			t.Errorf("%s.gz: %v; want hoard man's page, gzipped", p, err)
		}
	}
	for _, helper := range []string{"mount.fuse.hoard", "umount.fuse.hoard"} {
		if target, err := os.Readlink(filepath.Join(root, "usr", "sbin", helper)); err != nil || filepath.Join("/usr/sbin", target) != "/usr/bin/hoard" {
			t.Errorf("%s: %q %v, want a link to /usr/bin/hoard", helper, target, err)
		}
		if fi, err := os.Stat(filepath.Join(root, "usr", "sbin", helper)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s in the unpacked tree leads nowhere: %v", helper, err)
		}
	}
	out, err := exec.Command(hoard, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("hoard version: %v\n%s", err, out)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if head, err := exec.Command("git", "-C", "..", "rev-parse", "HEAD").Output(); err == nil {
		// Go stamps the version from git: a tag, or v0.0.0-DATE-COMMIT.
		commit := strings.TrimSpace(string(head))
		if !regexp.MustCompile(`^hoard v\d+\.\d+\.\d+\S*$`).MatchString(first) ||
			!strings.Contains(string(out), "commit: "+commit) {
			t.Errorf("hoard version says\n%s\nwant its version and commit %s", out, commit)
		}
	} else if !strings.HasPrefix(first, "hoard ") {
		t.Errorf("hoard version says\n%s", out)
	}
}

// The package's version is Debian's of git describe's, each sorting after
// the one before; a bare hash, even one starting with a digit, sorts
// before any tag.
func TestDebVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	for describe, want := range map[string]string{
		"v1.2":           "^1\\.2$",
		"v1.2-3-gabc123": `^1\.2\+3\.gabc123$`,
		"v1.2-rc1":       `^1\.2~rc1$`,
		"075f25d":        `^0\.0~git[0-9]{14}\.075f25d$`,
		"abcdef1":        `^0\.0~git[0-9]{14}\.abcdef1$`,
	} {
		out, err := exec.Command("make", "-s", "-C", "..", "deb-version", "GIT_DESCRIBE="+describe).Output()
		if err != nil {
			t.Fatalf("make deb-version: %v", err)
		}
		if got := strings.TrimSpace(string(out)); !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("git describe %s: version %q, want %s", describe, got, want)
		}
	}
}

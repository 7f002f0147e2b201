package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// testTree is a small hoard: mount, and vol move.
func testTree() (root, mount, move *cobra.Command) {
	run := func(*cobra.Command, []string) {}
	root = &cobra.Command{Use: "hoard"}
	root.PersistentFlags().String("log-level", "warn", "")
	root.PersistentFlags().String(Flag, "", "")
	mount = &cobra.Command{Use: "mount", Run: run}
	mount.Flags().String("cache", "/default", "")
	mount.Flags().Duration("timeout", 10*time.Second, "")
	vol := &cobra.Command{Use: "vol"}
	move = &cobra.Command{Use: "move", Run: run}
	move.Flags().StringSlice("host", nil, "")
	vol.AddCommand(move)
	root.AddCommand(mount, vol)
	return root, mount, move
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hoard.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func load(t *testing.T, root *cobra.Command, texts ...string) []*confFile {
	t.Helper()
	var files []*confFile
	for _, text := range texts {
		cf, err := readConfig(root, writeFile(t, text), true)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, cf)
	}
	return files
}

func sources(t *testing.T, c *cobra.Command, files []*confFile) map[string]string {
	t.Helper()
	ss, err := applyConfig(c, commandFlags(c), files)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, s := range ss {
		src := s.source
		for _, f := range files {
			src = strings.ReplaceAll(src, f.path, "FILE")
		}
		m[s.flag.Name] = s.flag.Value.String() + " " + src
	}
	return m
}

// The files merge key by key, the later winning; then the most specific
// table wins, from whichever file.
func TestConfigFilesMerge(t *testing.T) {
	root, mount, _ := testTree()
	system := "log-level = \"error\"\n[mount]\ncache = \"/system-mount\"\ntimeout = \"1s\"\n"
	user := "cache = \"/user-top\"\n[mount]\ntimeout = \"2s\"\n"
	got := sources(t, mount, load(t, root, system, user))
	for flag, want := range map[string]string{
		"cache":     "/system-mount FILE: line 3 [mount]",
		"timeout":   "2s FILE: line 3 [mount]",
		"log-level": "error FILE: line 1",
	} {
		if got[flag] != want {
			t.Errorf("%s: %q, want %q", flag, got[flag], want)
		}
	}
}

// A TOML array sets a list flag's whole list, and is refused by others.
func TestConfigLists(t *testing.T) {
	root, mount, move := testTree()
	got := sources(t, move, load(t, root, "[vol.move]\nhost = [\"a\", \"b\"]\n"))
	if want := "[a,b] FILE: line 2 [vol.move]"; got["host"] != want {
		t.Errorf("host: %q, want %q", got["host"], want)
	}
	files := load(t, root, "[mount]\ntimeout = [\"1s\"]\n")
	_, err := applyConfig(mount, commandFlags(mount), files)
	if want := files[0].path + `: line 2: invalid value [1s] for timeout in [mount]: want one value, not a list`; err == nil || err.Error() != want {
		t.Errorf("a list for a duration: %v, want %s", err, want)
	}
}

func TestKeyLines(t *testing.T) {
	doc := `top = 1
[mount]
# a comment
cache = "x"
vol.move.host = ["h"]
[vol . move]
server = { a = 1,
  b = 2 }
`
	got := keyLines([]byte(doc))
	for k, want := range map[string]int{"top": 1, "mount": 2, "mount.cache": 4, "mount.vol.move.host": 5,
		"vol": 6, "vol.move": 6, "vol.move.server": 7, "vol.move.server.b": 8} {
		if got[k] != want {
			t.Errorf("line of %s: %d, want %d (%v)", k, got[k], want, got)
		}
	}
}

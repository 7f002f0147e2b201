// Package config gives hoard's commands settings for the flags their
// command line leaves out, from HOARD_* environment variables and TOML
// files.
//
// A flag given on the command line wins; then HOARD_<FLAG> (upper case,
// dashes as underscores; empty counts as unset); then the file; then the
// flag's default. The files are /etc/hoard/hoard.toml and then
// $XDG_CONFIG_HOME/hoard/config.toml (~/.config/hoard/config.toml), merged
// key by key, the user's winning; --config FILE (or HOARD_CONFIG) reads
// FILE alone, which must exist.
//
// In a file, a top-level key sets that flag of every command that has it;
// a key in table [vol] sets it for hoard vol and each of its subcommands
// that has it; one in [vol.move] for hoard vol move alone. The most
// specific table wins. A key no command of its table has, or a table
// naming no command, is an error, as is a value the flag refuses (checked
// when a command uses it). Values set this way act as the flag's default:
// a command that wants a flag on its command line still wants it there.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/hoardfs/hoard/dirs"
	"github.com/knadh/koanf/parsers/toml/v2"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	gotoml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// systemConfig is the configuration file of every user on the machine.
const systemConfig = "/etc/hoard/hoard.toml"

// Flag names the flag that chooses the configuration file.
const Flag = "config"

// An Error is a mistake in how hoard was invoked: a file, a variable or
// a command line it cannot take (hoard exits 2 for it, as for a bad
// flag).
type Error struct{ error }

func (e Error) Unwrap() error { return e.error }

func usagef(format string, args ...any) error { return Error{fmt.Errorf(format, args...)} }

// confFile is one configuration file, parsed.
type confFile struct {
	path string
	k    *koanf.Koanf
	// lines holds the line of each key and table, by its dotted path.
	lines map[string]int
}

// configPaths are the files to read: the one named by --config or
// HOARD_CONFIG (given: it must exist), or the system's and the user's.
func configPaths(flags *pflag.FlagSet) (paths []string, given bool) {
	if f := flags.Lookup(Flag); f != nil && f.Changed {
		return []string{f.Value.String()}, true
	}
	if p := os.Getenv(envName(Flag)); p != "" {
		return []string{p}, true
	}
	paths = []string{systemConfig}
	if dir, err := dirs.UserConfigDir(); err == nil {
		paths = append(paths, filepath.Join(dir, "hoard", "config.toml"))
	}
	return paths, false
}

// loadConfig reads the configuration files flags's --config chooses,
// and checks their keys against every command under root.
func loadConfig(root *cobra.Command, flags *pflag.FlagSet) ([]*confFile, error) {
	paths, given := configPaths(flags)
	var files []*confFile
	for _, p := range paths {
		cf, err := readConfig(root, p, given)
		if err != nil {
			return nil, err
		}
		if cf != nil {
			files = append(files, cf)
		}
	}
	return files, nil
}

// readConfig reads the configuration file p, and checks its keys
// against every command under root; nil if p is missing and not given.
func readConfig(root *cobra.Command, p string, given bool) (*confFile, error) {
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) && !given {
		return nil, nil
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		if given {
			return nil, usagef("--config %s: %v", p, err)
		}
		return nil, usagef("%s: %v", p, err)
	}
	k := koanf.New(".")
	if err := k.Load(file.Provider(p), toml.Parser()); err != nil {
		var de *gotoml.DecodeError
		if errors.As(err, &de) {
			line, _ := de.Position()
			return nil, usagef("%s:%d: %s", p, line, strings.TrimPrefix(de.Error(), "toml: "))
		}
		return nil, usagef("%s: %v", p, err)
	}
	cf := &confFile{path: p, k: k, lines: keyLines(b)}
	if err := cf.check(root); err != nil {
		return nil, err
	}
	return cf, nil
}

// keyLines finds the line of every key and table of a TOML document
// that parses, by dotted path (koanf's maps lose where keys were).
func keyLines(b []byte) map[string]int {
	lines := map[string]int{}
	var p unstable.Parser
	p.Reset(b)
	var table []string
	var add func(prefix []string, it unstable.Iterator) []string
	add = func(prefix []string, it unstable.Iterator) []string {
		path := slices.Clone(prefix)
		for it.Next() {
			n := it.Node()
			path = append(path, string(n.Data))
			if k := strings.Join(path, "."); lines[k] == 0 {
				lines[k] = p.Shape(n.Raw).Start.Line
			}
		}
		return path
	}
	var keyval func(prefix []string, kv *unstable.Node)
	keyval = func(prefix []string, kv *unstable.Node) {
		path := add(prefix, kv.Key())
		if v := kv.Value(); v.Kind == unstable.InlineTable {
			for it := v.Children(); it.Next(); {
				keyval(path, it.Node())
			}
		}
	}
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = add(nil, e.Key())
		case unstable.KeyValue:
			keyval(table, e)
		}
	}
	return lines
}

// where is a key's place in the file, for messages: "FILE: line N".
func (cf *confFile) where(path string) string {
	if n := cf.lines[path]; n > 0 {
		return fmt.Sprintf("%s: line %d", cf.path, n)
	}
	return cf.path
}

// check reports the first key (by line) that no command of its table
// has as a flag, or table that names no command.
func (cf *confFile) check(root *cobra.Command) error {
	type problem struct {
		line int
		err  error
	}
	var probs []problem
	var walk func(c *cobra.Command, table []string, m map[string]any)
	walk = func(c *cobra.Command, table []string, m map[string]any) {
		for key, v := range m {
			path := strings.Join(append(slices.Clone(table), key), ".")
			if sub, ok := v.(map[string]any); ok {
				if child := subcommand(c, key); child != nil {
					walk(child, append(slices.Clone(table), key), sub)
					continue
				}
				probs = append(probs, problem{cf.lines[path], usagef("%s: unknown table [%s]: no command %s %s", cf.where(path), path, c.CommandPath(), key)})
				continue
			}
			if !anyHasFlag(c, key) {
				in := ""
				if len(table) > 0 {
					in = " in [" + strings.Join(table, ".") + "]"
				}
				probs = append(probs, problem{cf.lines[path], usagef("%s: unknown key %q%s", cf.where(path), key, in)})
			}
		}
	}
	walk(root, nil, cf.k.Raw())
	if len(probs) == 0 {
		return nil
	}
	sort.SliceStable(probs, func(i, j int) bool { return probs[i].line < probs[j].line })
	return probs[0].err
}

func subcommand(c *cobra.Command, name string) *cobra.Command {
	for _, s := range c.Commands() {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

// settable reports whether a configuration may set the flag name: not
// help, version or config itself.
func settable(name string) bool {
	return name != "help" && name != "version" && name != Flag
}

// commandFlags are all the flags of c: its own and those it inherits.
func commandFlags(c *cobra.Command) *pflag.FlagSet {
	fs := pflag.NewFlagSet(c.CommandPath(), pflag.ContinueOnError)
	fs.AddFlagSet(c.LocalFlags())
	fs.AddFlagSet(c.InheritedFlags())
	return fs
}

// anyHasFlag reports whether c or a command under it has the flag name.
func anyHasFlag(c *cobra.Command, name string) bool {
	if !settable(name) {
		return false
	}
	if commandFlags(c).Lookup(name) != nil {
		return true
	}
	for _, s := range c.Commands() {
		if anyHasFlag(s, name) {
			return true
		}
	}
	return false
}

// envName is the environment variable of the flag name.
func envName(name string) string {
	return "HOARD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// envIgnored reports whether the environment leaves c's flag name alone,
// as its variable means something else: HOARD_TOKEN holds a token (where
// --token names a file), HOARD_SERVER, HOARD_CACHE and HOARD_CA a
// client's server, cache and CA (not the server a certificate is for, a
// proxy's store, nor the CA hoard login stores and checks the token with).
func envIgnored(c *cobra.Command, name string) bool {
	switch name {
	case "token":
		return true
	case "ca":
		return c.CommandPath() == "hoard login"
	case "server":
		return c.CommandPath() == "hoard cell cert"
	case "cache":
		return c.CommandPath() == "hoard proxy"
	}
	return false
}

// setting is a flag's effective value and where it came from.
type setting struct {
	flag   *pflag.Flag
	source string // "flag", "env HOARD_X", "FILE: line N [table]", "default"
}

// applyConfig gives each flag of c (in fs, parsed) that the command line
// did not set its value from the environment or the files, through the
// flag's own Set, and returns every flag's setting.
func applyConfig(c *cobra.Command, fs *pflag.FlagSet, files []*confFile) ([]setting, error) {
	// The files' values for c: each table on c's path overrides the one
	// above it; within a table the later file overrides the earlier.
	var tables []string
	for p := c; p.HasParent(); p = p.Parent() {
		tables = append([]string{p.Name()}, tables...)
	}
	type fromFile struct {
		cf    *confFile
		path  string
		table string
	}
	merged := koanf.New(".")
	for _, cf := range files {
		merged.Merge(cf.k)
	}
	eff := koanf.New(".")
	found := map[string]fromFile{}
	for i := 0; i <= len(tables); i++ {
		table := strings.Join(tables[:i], ".")
		fs.VisitAll(func(f *pflag.Flag) {
			path := f.Name
			if table != "" {
				path = table + "." + f.Name
			}
			if !settable(f.Name) || !merged.Exists(path) {
				return
			}
			if _, ok := merged.Get(path).(map[string]any); ok {
				return
			}
			for j := len(files) - 1; j >= 0; j-- {
				if files[j].k.Exists(path) {
					found[f.Name] = fromFile{files[j], path, table}
					break
				}
			}
			eff.Set(f.Name, merged.Get(path))
		})
	}
	envk := koanf.New(".")
	envk.Load(env.Provider("", env.Opt{Prefix: "HOARD_", TransformFunc: func(k, v string) (string, any) {
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "HOARD_"), "_", "-"))
		if v == "" || envName(name) != k || !settable(name) || fs.Lookup(name) == nil || envIgnored(c, name) {
			return "", nil
		}
		return name, v
	}}), nil)
	eff.Merge(envk)
	// The command line over both; the defaults under them.
	eff.Load(posflag.Provider(fs, ".", eff), nil)

	var out []setting
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if !settable(f.Name) || err != nil {
			return
		}
		s := setting{flag: f, source: "default"}
		switch ff, inFile := found[f.Name]; {
		case f.Changed:
			s.source = "flag"
		case envk.Exists(f.Name):
			s.source = "env " + envName(f.Name)
			if e := setFlag(f, eff.Get(f.Name)); e != nil {
				err = usagef("%s=%q: invalid value for --%s: %v", envName(f.Name), eff.String(f.Name), f.Name, e)
			}
		case inFile:
			in := ""
			if ff.table != "" {
				in = " [" + ff.table + "]"
			}
			s.source = ff.cf.where(ff.path) + in
			if e := setFlag(f, eff.Get(f.Name)); e != nil {
				err = usagef("%s: invalid value %s for %s%s: %v", ff.cf.where(ff.path), tomlValue(eff.Get(f.Name)), f.Name, strings.Replace(in, " [", " in [", 1), e)
			}
		}
		out = append(out, s)
	})
	return out, err
}

// setFlag sets f to a value from the environment or a TOML file, as the
// command line would; a TOML array sets a list flag's whole list.
func setFlag(f *pflag.Flag, v any) error {
	if list, ok := v.([]any); ok {
		sv, ok := f.Value.(pflag.SliceValue)
		if !ok {
			return errors.New("want one value, not a list")
		}
		var vals []string
		for _, e := range list {
			vals = append(vals, scalar(e))
		}
		return sv.Replace(vals)
	}
	return f.Value.Set(scalar(v))
}

// scalar is a TOML value as the command line would give it.
func scalar(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return fmt.Sprint(v)
}

// tomlValue quotes a string value as it was written.
func tomlValue(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// Apply applies the configuration to cmd, about to run with its command
// line parsed.
func Apply(cmd *cobra.Command) error {
	files, err := loadConfig(cmd.Root(), cmd.Flags())
	if err != nil {
		return err
	}
	settings, err := applyConfig(cmd, cmd.Flags(), files)
	for _, st := range settings {
		// Plaintext from the environment or a file is easy to miss: say
		// so as loudly as --insecure on the command line does.
		if st.flag.Name == "insecure" && st.source != "flag" && st.source != "default" && st.flag.Value.String() == "true" {
			fmt.Fprintf(os.Stderr, "hoard: WARNING: insecure (from %s): no TLS and no token; whoever is on the network sees and can change everything sent\n", st.source)
		}
	}
	return err
}

// Command is hoard config: config show prints the settings a command
// would run with.
func Command() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "hoard's configuration file and environment"}
	show := &cobra.Command{
		Use:   "show COMMAND...",
		Short: "print the settings a command would run with, and where each comes from (flag, environment, file, default)",
		Long: `Print every flag of COMMAND with the value it would have, given the
flags that follow it, and where the value comes from: flag, env
HOARD_<FLAG>, the file and line that set it (and its table), or default.

Settings come from, highest first: the command line; HOARD_<FLAG>
variables (dashes as underscores); the files /etc/hoard/hoard.toml then
$XDG_CONFIG_HOME/hoard/config.toml (~/.config/hoard/config.toml), the
latter overriding, or the one --config FILE names; the flag's default.
In a file, top-level keys apply to every command with that flag, keys in
[mount] to hoard mount, in [vol] to hoard vol and its subcommands, in
[vol.move] to hoard vol move alone; the most specific wins.`,
		Example: `  hoard config show mount
  hoard config show server --data /srv/hoard
  HOARD_LOG_LEVEL=debug hoard config show vol move`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if slices.Contains(args, "-h") || slices.Contains(args, "--help") {
				return cmd.Help()
			}
			target, rest, err := cmd.Root().Find(args)
			if err != nil || target == cmd.Root() {
				return usagef("hoard config show: needs COMMAND, a hoard command such as mount or vol move")
			}
			flags := commandFlags(target)
			flags.SetOutput(new(strings.Builder))
			if err := flags.Parse(rest); err != nil {
				return usagef("%s: %v", target.CommandPath(), err)
			}
			files, err := loadConfig(cmd.Root(), flags)
			if err != nil {
				return err
			}
			settings, err := applyConfig(target, flags, files)
			if err != nil {
				return err
			}
			var read []string
			for _, f := range files {
				read = append(read, f.path)
			}
			if len(read) == 0 {
				read = []string{"none"}
			}
			fmt.Printf("# %s; configuration files: %s\n", target.CommandPath(), strings.Join(read, ", "))
			tw := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
			for _, s := range settings {
				if s.flag.Hidden {
					continue
				}
				v := s.flag.Value.String()
				if v == "" {
					v = `""`
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.flag.Name, v, s.source)
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(show)
	cmd.Example = show.Example
	return cmd
}

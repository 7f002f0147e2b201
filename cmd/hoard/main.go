// Command hoard is the one binary of the hoard distributed file system: the
// file server, the client tools, and (later) the FUSE mount and proxy.
package main

import (
	"errors"
	"fmt"
	"github.com/hoardfs/hoard/config"
	"io/fs"
	"os"
	"regexp"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hoardfs/hoard/lograte"
)

// usageError marks errors in how hoard was invoked: exit code 2.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// logs is the process's log: a warning or error repeated more than five
// times in ten seconds is counted, and told of once, not written again.
var logs *lograte.Handler

const logInterval = 10 * time.Second

func main() {
	root := &cobra.Command{
		Use:           "hoard",
		Short:         "hoard: a distributed file system built around its client cache",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("log-level", "warn", "log level: debug, info, warn, error")
	root.PersistentFlags().String(config.Flag, "", "read settings from this TOML file alone (env HOARD_CONFIG; default: /etc/hoard/hoard.toml, then ~/.config/hoard/config.toml; hoard config show)")
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		// Before anything reads a flag: the environment and the
		// configuration files fill in those not on the command line.
		if !cmd.DisableFlagParsing {
			if err := config.Apply(cmd); err != nil {
				return err
			}
		}
		return setupLogging(cmd)
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(serverCmd(), etcdCmd(), proxyCmd(), volCmd(), cacheCmd(), mountCmd(), umountCmd())
	root.AddCommand(cellCmd(), tokenCmd(), loginCmd(), logoutCmd(), tokensCmd(), whoamiCmd(), aclCmd(), groupCmd(), userCmd())
	root.AddCommand(fileCmds()...)
	root.AddCommand(versionCmd(), manCmd(root), config.Command())
	root.Version = "set" // cobra's --version flag, printing versionText
	root.SetVersionTemplate(versionText())
	root.SetHelpCommand(&cobra.Command{Use: "help [command]", Short: "help about any command",
		RunE: func(_ *cobra.Command, args []string) error {
			cmd, rest, err := root.Find(args)
			if err != nil {
				return err
			}
			if err := unknownCommand(cmd, rest); err != nil {
				return err
			}
			return cmd.Help()
		}})
	root.InitDefaultCompletionCmd() // now, to be made a group below
	groups(root)
	setExamples(root)
	err := root.Execute()
	if logs != nil {
		logs.Flush()
	}
	if err != nil {
		msg := describe(err)
		if !strings.HasPrefix(msg, "hoard ") { // "hoard put: needs ..." names itself
			msg = "hoard: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		closeLog()
		os.Exit(exitCode(err))
	}
	closeLog()
}

// groups makes every command under cmd that only groups subcommands fail
// on a name that is none of them, as a usage error, where cobra would show
// its help and succeed.
func groups(cmd *cobra.Command) {
	if cmd.HasSubCommands() && !cmd.Runnable() {
		cmd.Args = unknownCommand
		cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	} else if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			return argsErr(c, check(c, args))
		}
	}
	for _, c := range cmd.Commands() {
		groups(c)
	}
}

// fmtScan reports whether s is format with its numbers in to.
func fmtScan(s, format string, to ...any) bool {
	n, err := fmt.Sscanf(s, format, to...)
	return err == nil && n == len(to)
}

// argName is an argument in a command's usage line: NAME, [NAME], NAME...
var argName = regexp.MustCompile(`^\[?[A-Z][A-Z0-9_]*(\.\.\.)?\]?(\.\.\.)?$`)

// argsErr says what a command needs when cobra's check of its arguments
// failed ("hoard put: needs LOCAL and REMOTE"), from its usage line.
func argsErr(cmd *cobra.Command, err error) error {
	if err == nil || !strings.HasPrefix(err.Error(), "accepts ") && !strings.HasPrefix(err.Error(), "requires ") {
		return err
	}
	var names []string
	fields := strings.Fields(cmd.Use)
	for i, f := range fields[1:] {
		// A flag's value ("--to SERVER", "[--on SERVER]") is not an
		// argument.
		prev := fields[i]
		isValue := (strings.HasPrefix(prev, "-") || strings.HasPrefix(prev, "[-")) && !strings.HasSuffix(prev, "]")
		if argName.MatchString(f) && !isValue {
			names = append(names, strings.Trim(f, "[]"))
		}
	}
	what := "needs"
	var n, lo, hi, got int
	switch msg := err.Error(); {
	case strings.Contains(msg, "at most"),
		fmtScan(msg, "accepts %d arg(s), received %d", &n, &got) && got > n,
		fmtScan(msg, "accepts between %d and %d arg(s), received %d", &lo, &hi, &got) && got > hi:
		what = "takes only"
	}
	switch len(names) {
	case 0:
		return usagef("%s: takes no arguments", cmd.CommandPath())
	case 1:
		return usagef("%s: %s %s", cmd.CommandPath(), what, names[0])
	}
	return usagef("%s: %s %s and %s", cmd.CommandPath(), what, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
}

func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usageError{errors.New(msg)}
}

func exitCode(err error) int {
	var ue usageError
	var ce config.Error
	if errors.As(err, &ue) || errors.As(err, &ce) || strings.HasPrefix(err.Error(), "unknown command") ||
		strings.HasPrefix(err.Error(), "accepts ") || strings.HasPrefix(err.Error(), "requires ") {
		return 2
	}
	return 1
}

// describe renders an error on one line, file errors as "what: path".
func describe(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		var errno syscall.Errno
		if errors.As(pe.Err, &errno) && pe.Err == error(errno) {
			return fmt.Sprintf("%s: %s", errno.Error(), pe.Path)
		}
		return fmt.Sprintf("%s %s: %v", pe.Op, pe.Path, pe.Err)
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

// profileFlag adds the hidden --cpuprofile flag of the long-running commands.
func profileFlag(f *pflag.FlagSet, path *string) {
	f.StringVar(path, "cpuprofile", "", "write a CPU profile here until the process stops")
	f.MarkHidden("cpuprofile")
}

// startProfile starts a CPU profile into path (nothing when empty); stop
// ends it.
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, usagef("--cpuprofile %s: %v", path, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, usagef("--cpuprofile %s: %v", path, err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

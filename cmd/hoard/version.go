package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// What make build says of the build (-ldflags -X): when, and from which
// commit (of when, with changes not committed). Empty in a plain go
// build, which has Go's own stamp of the commit unless -buildvcs=false.
var built, commit, commitTime, modified string

// versionText says which hoard this is: the module's version, the
// commit it was built from (and whether the tree had changes), when,
// and with which Go.
func versionText() string {
	version, rev, when, dirty := "(devel)", "unknown", commitTime, modified == "true"
	if commit != "" {
		rev = commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "hoard %s\n", version)
	fmt.Fprintf(&b, "commit: %s", rev)
	if dirty {
		b.WriteString(" (with uncommitted changes)")
	}
	if when != "" {
		fmt.Fprintf(&b, ", of %s", when)
	}
	b.WriteString("\n")
	if built != "" {
		fmt.Fprintf(&b, "built: %s\n", built)
	}
	fmt.Fprintf(&b, "go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return b.String()
}

func versionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "say which hoard this is: version, commit, build date, Go (also hoard --version)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Print(versionText())
			return nil
		},
	}
	cmd.Example = "  hoard version\n  hoard --version"
	return cmd
}

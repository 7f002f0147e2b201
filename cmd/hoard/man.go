package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

// manCmd writes a man page per command (make man), from the commands'
// own help, so the pages never disagree with --help.
func manCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "man DIR",
		Short:  "write hoard's man pages (section 1) into DIR",
		Args:   cobra.ExactArgs(1),
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return usageError{err}
			}
			root.DisableAutoGenTag = true // the pages of one build are the same whenever made
			homeDefaults(root)
			// No Title: each page is titled by its command (HOARD\-MOUNT).
			if err := doc.GenManTree(root, &doc.GenManHeader{Section: "1", Source: "hoard", Manual: "hoard manual"}, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "man pages written to %s\n", args[0])
			return nil
		},
	}
}

// homeDefaults shows defaults under the home directory of whoever makes
// the pages (the cache, taken from the environment) as under ~, which
// each reader's own stands for.
func homeDefaults(c *cobra.Command) {
	home, err := os.UserHomeDir()
	if err != nil || home == "" || home == "/" {
		return
	}
	tilde := func(f *pflag.Flag) {
		if rest, ok := strings.CutPrefix(f.DefValue, home+"/"); ok {
			f.DefValue = "~/" + rest
		}
	}
	c.LocalFlags().VisitAll(tilde)
	c.PersistentFlags().VisitAll(tilde)
	for _, sub := range c.Commands() {
		homeDefaults(sub)
	}
}

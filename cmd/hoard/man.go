package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
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
			if err := doc.GenManTree(root, &doc.GenManHeader{Title: "HOARD", Section: "1", Source: "hoard", Manual: "hoard manual"}, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "man pages written to %s\n", args[0])
			return nil
		},
	}
}

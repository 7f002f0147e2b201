package main

import "github.com/spf13/cobra"

// examples are the examples of the commands whose definitions give none
// (groups, cobra's completion commands, and the commands made by the
// shared constructors), by command path: every --help shows one.
var examples = map[string]string{
	"hoard": "  hoard server --data /srv/hoard              # a server\n" +
		"  hoard mount /hoard                          # its files, here\n" +
		"  hoard ls -l /",
	"hoard acl":                   "  hoard acl get /proj\n  hoard acl set /proj alice rl",
	"hoard cache":                 "  hoard cache stats\n  hoard cache policy /big bypass",
	"hoard cache lost":            "  hoard cache lost",
	"hoard cache policy":          "  hoard cache policy /data/video bypass --recursive\n  hoard cache policy /data/video        # show it",
	"hoard cache stats":           "  hoard cache stats\n  hoard cache stats --cache ~/.cache/hoard",
	"hoard cat":                   "  hoard cat /proj/README /proj/NOTES",
	"hoard completion":            "  hoard completion bash > /etc/bash_completion.d/hoard",
	"hoard completion bash":       "  hoard completion bash > /etc/bash_completion.d/hoard",
	"hoard completion fish":       "  hoard completion fish > ~/.config/fish/completions/hoard.fish",
	"hoard completion powershell": "  hoard completion powershell | Out-String | Invoke-Expression",
	"hoard completion zsh":        "  hoard completion zsh > \"${fpath[1]}/_hoard\"",
	"hoard get":                   "  hoard get /proj/report.pdf ./report.pdf",
	"hoard group":                 "  hoard group create staff\n  hoard group add staff alice",
	"hoard group list":            "  hoard group list",
	"hoard ls":                    "  hoard ls /\n  hoard ls -l /proj",
	"hoard mkdir":                 "  hoard mkdir /proj/new\n  hoard mkdir -p /proj/a/b/c",
	"hoard mount":                 "  hoard mount /hoard\n  hoard mount --daemon --server files.example:7100 /hoard\n  hoard mount --metrics 9101 /hoard",
	"hoard mv":                    "  hoard mv /proj/draft /proj/final",
	"hoard proxy":                 "  hoard proxy --origin files.example:7100 --cache /var/cache/hoard/proxy --cell /etc/hoard/proxy --listen 0.0.0.0:7200",
	"hoard proxy stats":           "  hoard proxy stats --proxy 127.0.0.1:7200\n  hoard proxy stats --proxy 127.0.0.1:7200 --json",
	"hoard put":                   "  hoard put ./report.pdf /proj/report.pdf",
	"hoard rm":                    "  hoard rm /proj/old\n  hoard rm -r /proj/olddir",
	"hoard server":                "  hoard server --data /srv/hoard\n  hoard server --data /srv/b --cell /srv/b/cell --etcd https://a.example:2379 --listen 0.0.0.0:7100\n  hoard server --data /srv/hoard --metrics 9100",
	"hoard server list":           "  hoard server list",
	"hoard stat":                  "  hoard stat /proj/report.pdf",
	"hoard umount":                "  hoard umount /hoard\n  hoard umount --wait 0 /hoard   # do not wait for its writes to be stored",
	"hoard vol":                   "  hoard vol create proj\n  hoard vol mount proj /proj\n  hoard vol list",
	"hoard vol addsite":           "  hoard vol addsite sw s2\n  hoard vol release sw",
	"hoard vol create":            "  hoard vol create proj\n  hoard vol create sw --on s3",
	"hoard vol examine":           "  hoard vol examine proj",
	"hoard vol list":              "  hoard vol list",
	"hoard vol mount":             "  hoard vol mount proj /proj\n  hoard vol mount %sw /sw-rw      # always the read-write volume\n  hoard vol mount sw.readonly /sw-ro",
	"hoard vol release":           "  hoard vol release sw",
	"hoard vol remove":            "  hoard vol remove proj",
	"hoard vol remsite":           "  hoard vol remsite sw s3",
}

// setExamples gives cmd and its subcommands the examples above, where
// their definitions give none.
func setExamples(cmd *cobra.Command) {
	if ex, ok := examples[cmd.CommandPath()]; ok && cmd.Example == "" {
		cmd.Example = ex
	}
	for _, c := range cmd.Commands() {
		setExamples(c)
	}
}

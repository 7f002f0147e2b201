package mounthelper

import (
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/spf13/pflag"
)

// flags are a few of hoard mount's.
func flags() *pflag.FlagSet {
	f := pflag.NewFlagSet("mount", pflag.ContinueOnError)
	f.String("cache", "", "")
	f.String("token", "", "")
	f.Bool("nonempty", false, "")
	f.Bool("passthrough", true, "")
	f.String("server", "", "")
	f.Bool("daemon", false, "")
	return f
}

func TestArgs(t *testing.T) {
	for _, c := range []struct {
		argv []string
		want string // hoard's arguments, or the error
		vfs  VFSFlags
	}{
		{[]string{"h:1", "/m", "-o", `cache=/c,comment="a,b",_netdev,nonempty,ro`}, "mount --daemon --server=h:1 --cache=/c --nonempty -- /m", syscall.MS_RDONLY},
		// The last value of a key wins, in the place of its last use.
		{[]string{"h:1", "/m", "-o", "cache=/a,token=/t", "-o", "cache=/b,rw"}, "mount --daemon --server=h:1 --token=/t --cache=/b -- /m", 0},
		{[]string{"h:1", "/m", "-o", "bogus"}, `mount option "bogus": unknown`, 0},
		{[]string{"h:1", "/m", "-s", "-o", "bogus,noexec"}, "mount --daemon --server=h:1 -- /m", syscall.MS_NOEXEC},
		{[]string{"h:1", "/m", "-o", "server=x:2"}, "the server is the mount's source", 0},
		{[]string{"h:1", "/m", "-o", "daemon"}, "always a daemon", 0},
		{[]string{"h:1", "/m", "-o", "cache"}, "needs a value (cache=...)", 0},
		{[]string{"h:1"}, "needs SOURCE", 0},
		{[]string{"h:1", "/m", "-N", "ns"}, "another namespace", 0},
		{[]string{"h:1", "/m", "-x"}, "unknown flag -x", 0},
		{[]string{"h:1", "/m", "-o"}, "-o needs a value", 0},
	} {
		var got string
		var vfs VFSFlags
		call, err := Parse(c.argv)
		if err == nil {
			var args []string
			args, vfs, err = Args(call, flags(), io.Discard)
			got = strings.Join(args, " ")
		}
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, c.want) || vfs != c.vfs {
			t.Errorf("%v: %q %v, want %q %v", c.argv, got, vfs, c.want, c.vfs)
		}
	}
	if got := splitOptions(`a,b="c,d",e`); !slices.Equal(got, []string{"a", "b=c,d", "e"}) {
		t.Errorf("splitOptions: %q", got)
	}
}

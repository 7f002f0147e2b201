package main

import (
	"context"
	"fmt"
	"github.com/hoardfs/hoard/etcdchild"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/principal"
	"github.com/hoardfs/hoard/server"
	"github.com/hoardfs/hoard/vldb"
	"github.com/hoardfs/hoard/vnode"
)

// cellFlags are how a server finds its cell's location database and
// names itself there.
type cellFlags struct {
	etcd, etcdListen, name, advertise string
}

func (c *cellFlags) add(f *pflag.FlagSet) {
	f.StringVar(&c.etcd, "etcd", "", "the cell's etcd: client URLs, comma-separated (another server's embedded member, or a cluster); default: run a member of its own, in DIR/etcd")
	f.StringVar(&c.etcdListen, "etcd-listen", "127.0.0.1:0", "client address of the embedded etcd member (other servers join the cell with --etcd at it)")
	f.StringVar(&c.name, "name", "", "this server's name in the cell (default: its certificate's name; with --insecure, the --advertise address)")
	f.StringVar(&c.advertise, "advertise", "", "address clients are told to reach this server at (default: the --listen address)")
}

// leaseTTL is how long a server stays alive in the location database
// after its last renewal: a stopped server is seen stopped at once (it
// gives its lease back), a killed one within this.
const leaseTTL = 10 * time.Second

// joinCell opens the location database (starting the embedded member if
// no --etcd is given), makes it and store agree (server.JoinCell) and
// registers this server. stop undoes it; note says what it joined.
func (c cellFlags) join(store *vnode.Store, id *cell.Identity, cellDir string, lis net.Listener, reg *principal.Registry) (sc *server.Cell, stop func(), note string, err error) {
	if c.etcd != "" && c.etcdListen != "127.0.0.1:0" {
		return nil, nil, "", usagef("--etcd and --etcd-listen: the first joins an etcd elsewhere, the second configures the member of its own; pick one")
	}
	var member *etcdchild.Child
	stops := []func(){}
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	cfg := vldb.Config{Log: slog.Default(), Mirrors: []vldb.Mirror{reg}}
	if id != nil {
		cfg.TLS = id.ClientTLS()
	}
	if c.etcd != "" {
		cfg.Endpoints = strings.Split(c.etcd, ",")
	} else {
		secureDir := ""
		if id != nil {
			secureDir = cellDir
		}
		if member, err = etcdchild.Start(filepath.Join(store.Dir(), "etcd"), c.etcdListen, secureDir); err != nil {
			return nil, nil, "", err
		}
		stops = append(stops, member.Close)
		cfg.Endpoints = []string{member.Endpoint()}
	}
	db, err := vldb.Open(cfg)
	if err != nil {
		stop()
		return nil, nil, "", err
	}
	stops = append(stops, func() { db.Close() })
	reg.Keep(db)
	addr := c.advertise
	if addr == "" {
		addr = lis.Addr().String()
	}
	name := c.name
	switch {
	case name != "":
	case id != nil:
		name = id.Name
	default:
		name = addr
	}
	if err := server.JoinCell(store, db, name); err != nil {
		stop()
		return nil, nil, "", err
	}
	space := func() (uint64, uint64) { return diskSpace(store) }
	capacity, free := space()
	if err := db.Register(vldb.Server{Name: name, Addr: addr, Capacity: capacity, Free: free}, leaseTTL); err != nil {
		stop()
		return nil, nil, "", err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				capacity, free := space()
				if err := db.SetSpace(ctx, name, capacity, free); err != nil && ctx.Err() == nil {
					slog.Warn("free space not recorded in the location database", "err", err)
				}
			}
		}
	}()
	stops = append(stops, func() { cancel(); <-done })
	note = fmt.Sprintf("server %s of the cell at etcd %s", name, strings.Join(cfg.Endpoints, ","))
	if member != nil {
		note = fmt.Sprintf("server %s; the cell's etcd member of its own at %s (other servers join with --etcd %s)", name, member.Endpoint(), member.Endpoint())
	}
	return &server.Cell{DB: db, Name: name}, stop, note, nil
}

func serverListCmd() *cobra.Command {
	return withAdmin("list", "list the cell's file servers: liveness, volumes, space", cobra.NoArgs, nil, func(c *pathfs.FS, args []string) error {
		ss, err := c.Admin().Servers()
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tADDRESS\tALIVE\tVOLUMES\tFREE\tCAPACITY\tSTARTED")
		unknown := false
		for _, s := range ss {
			alive := "no"
			switch {
			case s.Unknown:
				alive, unknown = "?", true
			case s.Alive:
				alive = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Name, s.Addr, alive, s.Volumes, humanSize(s.Free), humanSize(s.Capacity), s.Started.Format(time.RFC3339))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if unknown {
			fmt.Fprintln(os.Stderr, "hoard: ALIVE ?: the server that answered has lost its own lease in the location database (etcd unreachable from it, or without a quorum): liveness unknown")
		}
		return nil
	})
}

// etcdCmd runs one member of an etcd cluster for a cell's location
// database: the etcd project's own server, built into hoard, so that a
// cell of three or five members needs no other program.
func etcdCmd() *cobra.Command {
	var mc vldb.MemberConfig
	var cellDir string
	var insecure bool
	cmd := &cobra.Command{
		Use:   "etcd --name NAME --data DIR --client ADDR --peer ADDR --cluster NAME=URL,...",
		Short: "run a member of an etcd cluster for the cell's location database",
		Example: "  hoard etcd --name e1 --data /var/lib/hoard-etcd --cell /etc/hoard/cell \\\n" +
			"    --client 10.0.0.1:2379 --peer 10.0.0.1:2380 \\\n" +
			"    --cluster e1=https://10.0.0.1:2380,e2=https://10.0.0.2:2380,e3=https://10.0.0.3:2380",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if mc.Name == "" || mc.Dir == "" || mc.ClientAddr == "" || mc.PeerAddr == "" {
				return usagef("hoard etcd: needs --name, --data, --client and --peer")
			}
			if insecure == (cellDir != "") {
				return usagef("hoard etcd: give --cell DIR (a server's cell directory: its certificates secure the member) or --insecure")
			}
			if cellDir != "" {
				if _, err := cell.Load(cellDir); err != nil {
					return usageError{err}
				}
				mc.CertFile, mc.KeyFile, mc.CAFile = filepath.Join(cellDir, cell.CertFile), filepath.Join(cellDir, cell.KeyFile), filepath.Join(cellDir, cell.CAFile)
			}
			m, err := vldb.StartMember(mc)
			if err != nil {
				return err
			}
			defer m.Close()
			fmt.Fprintf(os.Stderr, "hoard etcd: member %s serving clients at %s\n", mc.Name, m.Endpoint)
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
			select {
			case <-sig:
				return nil
			case err := <-m.Err():
				return fmt.Errorf("etcd member %s stopped: %v", mc.Name, err)
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&mc.Name, "name", "", "the member's name in its cluster")
	f.StringVar(&mc.Dir, "data", "", "directory holding the member's data")
	f.StringVar(&mc.ClientAddr, "client", "", "address its clients (the cell's servers) reach it at")
	f.StringVar(&mc.PeerAddr, "peer", "", "address the other members reach it at")
	f.StringVar(&mc.Cluster, "cluster", "", "every member of the first start: NAME=https://PEER,... (http:// with --insecure)")
	f.StringVar(&cellDir, "cell", "", "a cell directory with ca.crt, host.crt and host.key: peers and clients must show certificates of this cell")
	f.BoolVar(&insecure, "insecure", false, "plain TCP, no certificates (tests and benchmarks only)")
	return cmd
}

// diskSpace is the size and free space of the disk holding store (0, 0
// if unknown).
func diskSpace(store *vnode.Store) (size, free uint64) {
	fs, err := store.StatFS()
	if err != nil {
		return 0, 0
	}
	return fs.Blocks * fs.BlockSize, fs.BlocksFree * fs.BlockSize
}

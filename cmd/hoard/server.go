package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/hoardfs/hoard/metrics"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	insecurecreds "google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/hoardfs/hoard/cell"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/principal"
	"github.com/hoardfs/hoard/server"
	"github.com/hoardfs/hoard/server/session"
	"github.com/hoardfs/hoard/vnode"
)

func serverCmd() *cobra.Command {
	cfg := server.DefaultConfig()
	var data, listen, dataListen, dataAdvertise, profile, cellDir, metricsAddr, httpAddr string
	var insecure bool
	var cf cellFlags
	cmd := &cobra.Command{
		Use:   "server --data DIR [--listen 127.0.0.1:7100]",
		Short: "run a file server whose volumes live in DIR",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				return usagef("--data DIR is required")
			}
			if cfg.PromiseTTL <= 0 || cfg.BreakTimeout <= 0 || cfg.Ping <= 0 || cfg.MoveHold <= 0 || cfg.Grace < 0 || cfg.Lease < 0 {
				return usagef("--promise-ttl, --break-timeout, --ping and --move-hold must be positive, --grace and --lease not negative")
			}
			switch cfg.DirDelegations {
			case server.DirPrivate, server.DirAny, server.DirNone:
			default:
				return usagef("--dir-delegations %q: want %s, %s or %s", cfg.DirDelegations, server.DirPrivate, server.DirAny, server.DirNone)
			}
			if err := checkBounds(cmd.Flags(), &cfg); err != nil {
				return err
			}
			if err := checkDataFlags(dataListen, dataAdvertise); err != nil {
				return err
			}
			if insecure && cellDir != "" {
				return usagef("--insecure and --cell: pick one")
			}
			me, err := openMetrics(metricsAddr, httpAddr)
			if err != nil {
				return err
			}
			defer me.close()
			stop, err := startProfile(profile)
			if err != nil {
				return err
			}
			defer stop()
			store, err := vnode.Open(data)
			if err != nil {
				return usageError{err}
			}
			defer store.Close()
			for f, why := range store.Quarantined() {
				slog.Error("file quarantined: its last store could not be carried out; it answers EIO until a start that can", "fid", f, "err", why)
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return usagef("--listen %s: %v", listen, err)
			}
			dataLis, err := listenData(lis, dataListen)
			if err != nil {
				return err
			}
			if dataLis != nil {
				defer dataLis.Close()
			}
			if cfg.Key, err = session.LoadKey(filepath.Join(store.Dir(), "session.key")); err != nil {
				return err
			}
			reg := principal.New()
			cfg.Principals = reg
			var creds credentials.TransportCredentials
			var id *cell.Identity
			secNote := "insecure"
			if insecure {
				fmt.Fprintf(os.Stderr, "hoard server: "+insecureNote+"\n", lis.Addr())
			} else {
				var made bool
				if id, made, err = serverCell(cellDir, store.Dir(), lis); err != nil {
					return err
				}
				if made {
					fmt.Fprintf(os.Stderr, "hoard server: %s\n", madeNote(id, filepath.Join(store.Dir(), "cell")))
				}
				if creds, err = secureServer(&cfg, id, reg); err != nil {
					return err
				}
				secNote = fmt.Sprintf("cell %s, TLS 1.3", id.Cell)
			}
			if cellDir == "" {
				cellDir = filepath.Join(store.Dir(), "cell")
			}
			sc, leave, cellNote, err := cf.join(store, id, cellDir, lis, reg)
			if err != nil {
				return err
			}
			defer leave()
			if err := server.Migrate(store, reg); err != nil {
				return err
			}
			cfg.Cell = sc
			cfg.Logger = slog.Default()
			srv := server.New(server.Local(store), cfg)
			defer srv.Shutdown()
			dataNote := serveData(srv, dataLis, dataAdvertise)
			me.showVolumes(store.Volumes, sc)
			me.showCell(sc, store, srv)
			return serve("server", srv, lis, creds, fmt.Sprintf("serving %s on %s (epoch %d, %s, %s); %s", store.Dir(), lis.Addr(), store.Epoch(), dataNote, secNote, cellNote), me)
		},
	}
	cmd.AddCommand(serverListCmd())
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "directory holding the server's volumes (created if missing)")
	f.StringVar(&listen, "listen", "127.0.0.1:7100", "address to serve on")
	f.StringVar(&cellDir, "cell", "", "the server's cell identity: a directory with ca.crt, host.crt and host.key (hoard cell init, hoard cell cert); default DIR/cell, made on the first start")
	f.BoolVar(&insecure, "insecure", false, "serve without TLS or authentication: every request may do anything (benchmarks only)")
	dataFlags(f, &dataListen, &dataAdvertise, "", "")
	cf.add(f)
	f.DurationVar(&cfg.PromiseTTL, "promise-ttl", cfg.PromiseTTL, "lifetime of a callback promise")
	f.DurationVar(&cfg.BreakTimeout, "break-timeout", cfg.BreakTimeout, "how long a change waits for a silent client to acknowledge a break")
	f.DurationVar(&cfg.Ping, "ping", cfg.Ping, "back-channel keepalive interval")
	f.DurationVar(&cfg.Lease, "lease", cfg.Lease, "how long a delegation outlives its holder's last request, and how long a recall may go unanswered (0: no delegations)")
	f.DurationVar(&cfg.Grace, "grace", cfg.Grace, "after a start, how long changes wait for clients of the previous life to reconnect")
	f.StringVar(&cfg.DirDelegations, "dir-delegations", cfg.DirDelegations, "which directories a client may make files in on its own: private (one no other client has cached), any (breaking others' promises), none")
	profileFlag(f, &profile)
	logFlags(f, "log here, rotated by size (default: stderr)")
	metricsFlag(f, &metricsAddr, &httpAddr)
	f.DurationVar(&cfg.MoveHold, "move-hold", cfg.MoveHold, "how long a volume moving away waits, frozen, for a mover that went silent before it serves as before")
	f.BoolVar(&cfg.AnonymousListing, "anonymous-listing", false, "let callers without a token learn the cell's volume names and servers (for a cell open to anonymous users beyond one server's public volumes)")
	f.IntVar(&cfg.MaxPromises, "max-promises", cfg.MaxPromises, "promises held across all clients before the oldest are broken")
	boundFlags(f, &cfg)
	return cmd
}

// boundFlags adds the flags of the bounds a server or proxy keeps on
// what its clients hold (docs/reliability.md).
func boundFlags(f *pflag.FlagSet, cfg *server.Config) {
	f.IntVar(&cfg.MaxSessions, "max-sessions", cfg.MaxSessions, "clients connected at once; past it a client is refused (RESOURCE_EXHAUSTED), 0: no bound")
	f.IntVar(&cfg.MaxSessionsPerPeer, "max-sessions-per-peer", cfg.MaxSessionsPerPeer, "clients connected at once from one IP address, 0: no bound")
	f.IntVar(&cfg.MaxDataConns, "max-data-conns", cfg.MaxDataConns, "bulk-data connections open at once; past it a new one is refused, and its client moves that data over gRPC, 0: no bound")
	f.IntVar(&cfg.MaxDataConnsPerPeer, "max-data-conns-per-peer", cfg.MaxDataConnsPerPeer, "bulk-data connections open at once from one IP address (IPv6: one /64), 0: no bound")
	f.DurationVar(&cfg.DataRequestTimeout, "data-request-timeout", cfg.DataRequestTimeout, "how long a bulk-data connection has to send a whole request once it begins one, and its first once it opens, before it is closed")
	f.DurationVar(&cfg.DataIdleTimeout, "data-idle-timeout", cfg.DataIdleTimeout, "how long a bulk-data connection may wait between requests before it is closed (a client dials again when it needs one)")
}

// checkBounds refuses bounds that make no sense, and lowers those the
// open-file limit cannot hold (server.Config.FitDescriptors): a bound
// the operator set is lowered with a warning, a default quietly.
func checkBounds(f *pflag.FlagSet, cfg *server.Config) error {
	if cfg.MaxSessions < 0 || cfg.MaxSessionsPerPeer < 0 || cfg.MaxDataConns < 0 || cfg.MaxDataConnsPerPeer < 0 || cfg.DataRequestTimeout <= 0 || cfg.DataIdleTimeout <= 0 {
		return usagef("--max-sessions, --max-sessions-per-peer, --max-data-conns and --max-data-conns-per-peer must not be negative, --data-request-timeout and --data-idle-timeout must be positive")
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return fmt.Errorf("open-file limit: %v", err)
	}
	limit := int(min(rl.Cur, 1<<30))
	for _, l := range cfg.FitDescriptors(limit) {
		log := slog.Debug
		if f.Changed(l.Flag) {
			log = slog.Warn
		}
		log("a bound on connections lowered to fit the open-file limit (RLIMIT_NOFILE; raise it to serve more)", "flag", "--"+l.Flag, "from", l.From, "to", l.To, "limit", limit)
	}
	return nil
}

// dataFlags adds the bulk-data channel's flags; def is --data-listen's
// default and says what it means.
func dataFlags(f *pflag.FlagSet, listen, advertise *string, def, means string) {
	f.StringVar(advertise, "data-advertise", "", "address clients are told to reach the data channel at (default: the --data-listen address; a relay or NAT in between needs its own)")
	f.StringVar(listen, "data-listen", def, "address of the bulk-data channel (empty, a server's default: the --listen host, any port; none: off, data then travels over gRPC)"+means)
}

func checkDataFlags(listen, advertise string) error {
	if advertise == "" {
		return nil
	}
	if listen == "none" {
		return usagef("--data-advertise %s: the data channel is off (--data-listen none)", advertise)
	}
	if _, _, err := net.SplitHostPort(advertise); err != nil {
		return usagef("--data-advertise %s: %v", advertise, err)
	}
	return nil
}

// listenData opens the data channel's listener (nil with --data-listen
// none); by default on the control address's host, a port of its own.
func listenData(control net.Listener, listen string) (net.Listener, error) {
	if listen == "none" {
		return nil, nil
	}
	if listen == "" {
		host, _, _ := net.SplitHostPort(control.Addr().String())
		listen = net.JoinHostPort(host, "0")
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, usagef("--data-listen %s: %v", listen, err)
	}
	return l, nil
}

// serveData starts srv's data channel on l (if any) and says where.
func serveData(srv *server.Server, l net.Listener, advertise string) string {
	if l == nil {
		return "data over gRPC"
	}
	srv.ServeData(l, advertise)
	note := "data channel " + l.Addr().String()
	if advertise != "" {
		note += " advertised as " + advertise
	}
	return note
}

// maxStreams bounds one connection's requests under way: a proxy sends all
// its clients' through one.
const maxStreams = 1024

// serve answers srv's RPCs on lis until SIGTERM or SIGINT, announcing
// itself (`hoard NAME: banner`) once it listens.
func serve(name string, srv *server.Server, lis net.Listener, creds credentials.TransportCredentials, banner string, me *endpoint, register ...func(*grpc.Server)) error {
	if creds == nil {
		creds = insecurecreds.NewCredentials()
	}
	unary, stream := []grpc.UnaryServerInterceptor{srv.Trace}, []grpc.StreamServerInterceptor{srv.TraceStream}
	var gm *grpcprom.ServerMetrics
	if me != nil {
		gm = metrics.GRPC(me.reg)
		metrics.Server(me.reg, srv.Load)
		me.showServer(srv, lis.Addr().String())
		unary = append([]grpc.UnaryServerInterceptor{gm.UnaryServerInterceptor()}, unary...)
		stream = append([]grpc.StreamServerInterceptor{gm.StreamServerInterceptor()}, stream...)
	}
	g := grpc.NewServer(grpc.Creds(creds),
		grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...),
		grpc.MaxRecvMsgSize(16<<20),
		// A connection's concurrent requests, and the time it has to say
		// who it is: a client that opens more waits, one that says
		// nothing is closed.
		grpc.MaxConcurrentStreams(maxStreams), grpc.ConnectionTimeout(10*time.Second),
		grpc.InitialWindowSize(8<<20), grpc.InitialConnWindowSize(64<<20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
	)
	pb.RegisterFileServerServer(g, srv)
	for _, r := range register {
		r(g)
	}
	if gm != nil {
		gm.InitializeMetrics(g)
	}
	defer me.start(name)()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(srv.Bound(lis)) }()
	fmt.Fprintf(os.Stderr, "hoard %s: %s\n", name, banner)
	notifyReady()
	select {
	case err := <-errc:
		return err
	case s := <-sig:
		slog.Info("stopping", "signal", s)
	}
	notifyStopping()
	// Back channels never end on their own: give RPCs in flight a
	// moment, then stop.
	srv.Shutdown()
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		g.Stop()
	}
	fmt.Fprintf(os.Stderr, "hoard %s: stopped\n", name)
	return nil
}

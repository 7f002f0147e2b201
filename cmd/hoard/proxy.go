package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hoardfs/hoard/metrics"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hoardfs/hoard/cell"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/proxy"
	"github.com/hoardfs/hoard/proxystore"
	"github.com/hoardfs/hoard/server"
	"github.com/hoardfs/hoard/server/session"
)

func proxyCmd() *cobra.Command {
	cfg := server.DefaultConfig()
	// A break from the origin waits for the proxy's clients, within the
	// origin's own break timeout (2 s by default): give up on a silent
	// client of the proxy sooner than the origin gives up on the proxy.
	cfg.BreakTimeout = time.Second
	var origin, listen, dir, size, layout, dataListen, dataAdvertise, cellDir, metricsAddr, httpAddr string
	var timeout, fast time.Duration
	var noDeleg, insecure bool
	cmd := &cobra.Command{
		Use:   "proxy --origin ADDR --cache DIR [--listen 127.0.0.1:7200]",
		Short: "run a caching proxy: clients point at it as at a server, and it serves them from its cache of the origin",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if origin == "" || dir == "" {
				return usagef("--origin ADDR and --cache DIR are required")
			}
			if _, _, err := net.SplitHostPort(origin); err != nil {
				return usagef("--origin %s: %v", origin, err)
			}
			n, err := parseSize(size)
			if err != nil || n <= 0 {
				return usagef("--cache-size %q: want a positive size such as 512M or 10G", size)
			}
			if cfg.PromiseTTL <= 0 || cfg.BreakTimeout <= 0 || cfg.Ping <= 0 || cfg.Grace < 0 || timeout <= 0 || fast <= 0 {
				return usagef("--promise-ttl, --break-timeout, --ping, --timeout and --fast-fetch must be positive, --grace not negative")
			}
			if layout != proxystore.Pooled && layout != proxystore.PerChunk {
				return usagef("--layout %q: want %s or %s", layout, proxystore.Pooled, proxystore.PerChunk)
			}
			if err := checkBounds(cmd.Flags(), &cfg); err != nil {
				return err
			}
			if err := checkDataFlags(dataListen, dataAdvertise); err != nil {
				return err
			}
			me, err := openMetrics(metricsAddr, httpAddr)
			if err != nil {
				return err
			}
			defer me.close()
			if insecure == (cellDir != "") {
				return usagef("--cell DIR is required (the proxy's identity: hoard cell cert --proxy NAME makes one), or --insecure for an insecure origin")
			}
			var id *cell.Identity
			if !insecure {
				if id, err = cell.Load(cellDir); err != nil {
					return usageError{err}
				}
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return usagef("--listen %s: %v", listen, err)
			}
			defer lis.Close()
			dataLis, err := listenData(lis, dataListen)
			if err != nil {
				return err
			}
			if dataLis != nil {
				defer dataLis.Close()
			}
			popts := proxy.Options{Origin: origin, Dir: dir, CacheSize: n, Timeout: timeout,
				Layout: layout, FastFetch: fast, NoDelegations: noDeleg, Logger: slog.Default()}
			if id != nil {
				popts.TLS = id.ClientTLS()
			}
			p, err := proxy.Open(popts)
			if err != nil {
				return usagef("proxy of %s in %s: %v", origin, dir, err)
			}
			defer p.Close()
			if cfg.Key, err = session.LoadKey(filepath.Join(dir, "session.key")); err != nil {
				return err
			}
			cfg.Logger = slog.Default()
			cfg.Lease = p.Lease()
			cfg.DataStreams = proxy.OriginStreams
			var creds credentials.TransportCredentials
			secNote := "insecure"
			if id != nil {
				cfg.Users, cfg.TLS = p.Users(), id.ServerTLS()
				creds = credentials.NewTLS(id.ServerTLS())
				secNote = fmt.Sprintf("cell %s, TLS 1.3", id.Cell)
			} else {
				fmt.Fprintf(os.Stderr, "hoard proxy: "+insecureNote+"\n", lis.Addr())
			}
			srv := server.New(p, cfg)
			p.Serve(srv)
			if me != nil {
				metrics.Client(me.reg, p.OriginStats)
				metrics.Proxy(me.reg, p.Stats)
				me.showProxy(p)
			}
			defer srv.Shutdown()
			dataNote := serveData(srv, dataLis, dataAdvertise)
			return serve("proxy", srv, lis, creds, fmt.Sprintf("serving %s from cache %s (%s) on %s (epoch %d, %s, %s)", origin, dir, layout, lis.Addr(), p.Epoch(), dataNote, secNote),
				me, func(g *grpc.Server) { pb.RegisterProxyServer(g, statsServer{p: p, srv: srv}) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&origin, "origin", "", "the file server to cache, host:port")
	f.StringVar(&listen, "listen", "127.0.0.1:7200", "address to serve clients on")
	f.StringVar(&cellDir, "cell", "", "the proxy's cell identity: a directory with ca.crt, host.crt and host.key, made by hoard cell cert --proxy NAME")
	metricsFlag(f, &metricsAddr, &httpAddr)
	logFlags(f, "log here, rotated by size (default: stderr)")
	f.BoolVar(&insecure, "insecure", false, "talk to an insecure origin and serve without TLS or authentication (benchmarks only)")
	f.StringVar(&dir, "cache", "", "directory of the proxy's cache (created if missing)")
	sizeVar(f, &size, "cache-size", "10G", "size of the disk store of file data, e.g. 512M, 10G (the pooled layout allocates it at once)")
	f.StringVar(&layout, "layout", proxystore.Pooled, "disk store layout: pooled (large preallocated files, chunks placed by file and user) or per-chunk (one file per chunk)")
	f.DurationVar(&fast, "fast-fetch", 10*time.Millisecond, "chunks fetched from the origin quicker than this are evicted first (cheap to fetch again)")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "how long a request waits for an unreachable origin before it fails")
	f.DurationVar(&cfg.PromiseTTL, "promise-ttl", cfg.PromiseTTL, "longest callback promise given to clients (never past the proxy's own from the origin)")
	f.DurationVar(&cfg.BreakTimeout, "break-timeout", cfg.BreakTimeout, "how long a change waits for a silent client to acknowledge a break (keep it below the origin's)")
	f.DurationVar(&cfg.Ping, "ping", cfg.Ping, "back-channel keepalive interval")
	f.DurationVar(&cfg.Grace, "grace", cfg.Grace, "after a start, how long changes wait for clients of the previous life to reconnect")
	boundFlags(f, &cfg)
	dataFlags(f, &dataListen, &dataAdvertise, "none", "; off by default (docs/architecture.md, \"Caching proxy\"); with it, clients are asked for 16 connections, each carrying one fetch at a time, which waits for the origin on a cold proxy")
	f.BoolVar(&noDeleg, "no-delegations", false, "take no delegations from the origin, and give clients none: their opens go to the proxy, as with a server run with --lease 0 (by default the proxy gives them delegations under those it holds from the origin)")
	cmd.AddCommand(proxyStatsCmd())
	return cmd
}

// statsServer answers hoard proxy stats.
type statsServer struct {
	pb.UnimplementedProxyServer
	p   *proxy.Proxy
	srv *server.Server
}

func (s statsServer) Stats(context.Context, *pb.ProxyStatsRequest) (*pb.ProxyStatsReply, error) {
	st, o := s.p.Stats(), s.p.OriginStats()
	return &pb.ProxyStatsReply{Origin: s.p.Origin(), Layout: st.Layout, Hits: st.Hits, Misses: st.Misses,
		BytesServed: st.BytesServed, BytesFetched: st.BytesFetched, Evictions: st.Evictions, Torn: st.Torn,
		Files: st.Files, Runs: st.Runs, Chunks: st.Chunks, BytesUsed: st.BytesUsed, Limit: st.Limit,
		ChunkSize: st.ChunkSize, Epoch: s.p.Epoch(), MapNanos: st.MapNanos, ReadNanos: st.ReadNanos, ServeNanos: st.ServeNanos,
		OriginRequests: o.RPCs, OriginReadDelegations: int64(o.ReadDelegations), OriginWriteDelegations: int64(o.WriteDelegations),
		OriginRecalls: o.Recalls, OriginResets: o.Resets, Delegations: int64(s.srv.Delegations())}, nil
}

func proxyStatsCmd() *cobra.Command {
	var addr string
	var timeout time.Duration
	var asJSON bool
	var sec securityFlags
	cmd := &cobra.Command{
		Use:   "stats --proxy ADDR",
		Short: "a running proxy's hit ratio, bytes served and fetched from the origin, store fragmentation, evictions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return usagef("--proxy %q: %v", addr, err)
			}
			tlsc, _, err := sec.resolve()
			if err != nil {
				return err
			}
			creds := insecure.NewCredentials()
			if tlsc != nil {
				creds = credentials.NewTLS(tlsc)
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				return usagef("--proxy %s: %v", addr, err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			r, err := pb.NewProxyClient(conn).Stats(ctx, &pb.ProxyStatsRequest{}, grpc.WaitForReady(true))
			switch status.Code(err) {
			case codes.OK:
			case codes.Unimplemented:
				return fmt.Errorf("%s is not a hoard proxy (a file server?)", addr)
			case codes.DeadlineExceeded:
				return fmt.Errorf("proxy %s: no answer within %v", addr, timeout)
			default:
				return fmt.Errorf("proxy %s: %v", addr, status.Convert(err).Message())
			}
			if asJSON {
				b, _ := protojson.MarshalOptions{EmitUnpopulated: true, UseProtoNames: true}.Marshal(r)
				fmt.Println(string(b))
				return nil
			}
			printProxyStats(addr, r)
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "proxy", "127.0.0.1:7200", "the proxy's address")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the proxy")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the counters as JSON")
	sec.add(cmd.Flags())
	return cmd
}

func printProxyStats(addr string, r *pb.ProxyStatsReply) {
	ratio, avg := 0.0, 0.0
	if r.Hits+r.Misses > 0 {
		ratio = float64(r.Hits) / float64(r.Hits+r.Misses)
	}
	if r.Runs > 0 {
		avg = float64(r.Chunks) / float64(r.Runs)
	}
	fmt.Printf("proxy %s, epoch %d, store layout %s, chunk %d bytes\n", addr, r.Epoch, r.Layout, r.ChunkSize)
	fmt.Printf("hit ratio:        %.1f%% (%d chunk reads from the store, %d from the origin)\n", 100*ratio, r.Hits, r.Misses)
	fmt.Printf("served clients:   %d bytes\n", r.BytesServed)
	fmt.Printf("fetched from origin %s: %d bytes\n", r.Origin, r.BytesFetched)
	fmt.Printf("origin requests:  %d; delegations held from it: %d read, %d write; recalls from it: %d; resets by it: %d\n",
		r.OriginRequests, r.OriginReadDelegations, r.OriginWriteDelegations, r.OriginRecalls, r.OriginResets)
	fmt.Printf("clients hold:     %d delegations from this proxy\n", r.Delegations)
	fmt.Printf("store:            %d of %d bytes, %d files, %d chunks in %d runs\n", r.BytesUsed, r.Limit, r.Files, r.Chunks, r.Runs)
	fmt.Printf("average run:      %.2f chunks (%.0f bytes)\n", avg, avg*float64(r.ChunkSize))
	if blocks := float64(r.BytesServed) / 4096; blocks > 0 {
		us := func(ns int64) float64 { return float64(ns) / 1e3 / blocks }
		fmt.Printf("per 4 KiB served: %.2f µs (map %.2f, store read %.2f, origin fetch and other %.2f)\n",
			us(r.ServeNanos), us(r.MapNanos), us(r.ReadNanos), us(r.ServeNanos-r.MapNanos-r.ReadNanos))
	}
	fmt.Printf("evictions:        %d runs\n", r.Evictions)
	fmt.Printf("torn after crash: %d chunks (dropped, never served)\n", r.Torn)
}

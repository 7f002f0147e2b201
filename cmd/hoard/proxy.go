package main

import (
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/hoardfs/hoard/proxy"
	"github.com/hoardfs/hoard/server"
)

func proxyCmd() *cobra.Command {
	cfg := server.DefaultConfig()
	// A break from the origin waits for the proxy's clients, within the
	// origin's own break timeout (2 s by default): give up on a silent
	// client of the proxy sooner than the origin gives up on the proxy.
	cfg.BreakTimeout = time.Second
	// Delegations through a proxy are not there yet: its clients take
	// callback promises only.
	cfg.Lease = 0
	var origin, listen, dir, size string
	var timeout time.Duration
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
			if cfg.PromiseTTL <= 0 || cfg.BreakTimeout <= 0 || cfg.Ping <= 0 || cfg.Grace < 0 || timeout <= 0 {
				return usagef("--promise-ttl, --break-timeout, --ping and --timeout must be positive, --grace not negative")
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return usagef("--listen %s: %v", listen, err)
			}
			defer lis.Close()
			p, err := proxy.Open(proxy.Options{Origin: origin, Dir: dir, CacheSize: n, Timeout: timeout, Logger: slog.Default()})
			if err != nil {
				return usagef("proxy of %s in %s: %v", origin, dir, err)
			}
			defer p.Close()
			cfg.Logger = slog.Default()
			srv := server.New(p, cfg)
			p.Serve(srv)
			defer srv.Shutdown()
			return serve("proxy", srv, lis, fmt.Sprintf("serving %s from cache %s on %s (epoch %d)", origin, dir, lis.Addr(), p.Epoch()))
		},
	}
	f := cmd.Flags()
	f.StringVar(&origin, "origin", "", "the file server to cache, host:port")
	f.StringVar(&listen, "listen", "127.0.0.1:7200", "address to serve clients on")
	f.StringVar(&dir, "cache", "", "directory of the proxy's cache (created if missing)")
	f.StringVar(&size, "cache-size", "10G", "cache size limit, e.g. 512M, 10G")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "how long a request waits for an unreachable origin before it fails")
	f.DurationVar(&cfg.PromiseTTL, "promise-ttl", cfg.PromiseTTL, "longest callback promise given to clients (never past the proxy's own from the origin)")
	f.DurationVar(&cfg.BreakTimeout, "break-timeout", cfg.BreakTimeout, "how long a change waits for a silent client to acknowledge a break (keep it below the origin's)")
	f.DurationVar(&cfg.Ping, "ping", cfg.Ping, "back-channel keepalive interval")
	f.DurationVar(&cfg.Grace, "grace", cfg.Grace, "after a start, how long changes wait for clients of the previous life to reconnect")
	return cmd
}

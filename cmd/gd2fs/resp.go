package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gd2fs/gd2fs/internal/resp"
	"github.com/gd2fs/gd2fs/internal/server"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// respFlags are gd2fs server's Redis-protocol flags.
type respFlags struct {
	listen, pool, prefetch string
	plaintext              bool
}

// respTLS is the RESP door's TLS: the node's own (--tls-cert) when it has
// one. A cluster that talks TLS but gives the door no certificate would
// serve the token and every value in clear: refused unless the operator
// says --resp-plaintext.
func respTLS(g *globals, plaintext bool) (*tls.Config, error) {
	if g.serverTLS == nil && g.clientTLS != nil && !plaintext {
		return nil, errors.New("the cluster uses TLS but this Redis-protocol door has no certificate: give it --tls-cert and --tls-key (clients then connect with redis-cli --tls, redis-py ssl=True), or pass --resp-plaintext to serve it in clear on a network you trust")
	}
	if plaintext {
		return nil, nil
	}
	return g.serverTLS, nil
}

func (r *respFlags) add(f *pflag.FlagSet) {
	f.StringVar(&r.listen, "resp-listen", "", "also serve the KV cache to Redis clients (RESP2/RESP3) on this address, e.g. :6380 (default: off)")
	f.StringVar(&r.pool, "resp-pool", "perf", "KV pool the Redis-protocol endpoint serves")
	f.StringVar(&r.prefetch, "resp-prefetch", "off", "what EXISTS prefetches from the KV disk tier to DRAM for the GET that follows: off, on (the keys found), lmcache (also <chunk>kv_bytes for EXISTS <chunk>metadata)")
	f.BoolVar(&r.plaintext, "resp-plaintext", false, "serve the Redis protocol without TLS even when the cluster uses TLS (the token and values travel in clear)")
}

// start serves RESP beside s when --resp-listen is set; the returned
// function stops it.
func (r *respFlags) start(ctx context.Context, g *globals, s *server.Server, maxValue int64) (func(), error) {
	if r.listen == "" {
		return func() {}, nil
	}
	stls, err := respTLS(g, r.plaintext)
	if err != nil {
		return nil, err
	}
	rs, err := resp.Attach(s, resp.AttachConfig{Listen: r.listen, Master: g.master, Token: g.token, Pool: r.pool, MaxValue: maxValue, TLS: g.clientTLS, ServerTLS: stls, Log: g.logger()})
	if err != nil {
		return nil, err
	}
	if err := rs.SetPrefetch(r.prefetch); err != nil {
		rs.Close()
		return nil, fmt.Errorf("--resp-prefetch: %w", err)
	}
	fmt.Fprintf(os.Stderr, "gd2fs server %s: Redis protocol on %s (pool %s)\n", s.ID(), rs.Addr(), r.pool)
	go rs.Serve(ctx)
	return func() { rs.Close() }, nil
}

func newRESP(g *globals) *cobra.Command {
	var listen, pool, maxValue, prefetch string
	var plaintext bool
	cmd := &cobra.Command{
		Use:   "resp",
		Short: "Run a stateless Redis-protocol gateway to the cluster's KV cache (for redis-cli, redis-py, LMCache)",
		Long: `Serves the hash-mode KV cache to Redis clients (RESP2 and RESP3): GET, SET, MGET, MSET, EXISTS,
DEL, SCAN, DBSIZE, ... Every key is forwarded to the data server that owns it, so clients that
cannot route by key see one key space. Data servers can serve Redis clients themselves
(gd2fs server --resp-listen), which saves a hop for the keys they own. The AUTH password is the
cluster token. See docs/resp.md for the commands and how they differ from Redis.`,
		Example: `  gd2fs resp --listen :6379 --master http://m:7070
  redis-cli -p 6379 SET llama/0/8f3a "$(cat block.bin)"
  # a TLS cluster: the gateway serves TLS with its own certificate
  gd2fs resp --listen :6379 --master https://m:7070 --tls-cert gw.pem --tls-key gw-key.pem --tls-ca ca.pem --token-file /etc/gd2fs/token
  redis-cli --tls --cacert ca.pem -p 6379 -a "$(cat /etc/gd2fs/token)" PING
  LMCACHE_REMOTE_URL=redis://gateway:6379 ...        # LMCache's redis backend, unchanged
  gd2fs resp --listen :6379 --master http://m:7070 --prefetch lmcache   # EXISTS warms the chunk for its GET`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mv, err := parseSize(maxValue)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			stls, err := respTLS(g, plaintext)
			if err != nil {
				return err
			}
			rs, err := resp.Gateway(listen, g.master, g.token, pool, mv, g.clientTLS, stls, g.logger())
			if err != nil {
				return err
			}
			if err := rs.SetPrefetch(prefetch); err != nil {
				rs.Close()
				return fmt.Errorf("--prefetch: %w", err)
			}
			fmt.Fprintf(os.Stderr, "gd2fs resp gateway on %s (master %s, pool %s)\n", rs.Addr(), g.master, pool)
			return rs.Serve(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":6379", "address Redis clients connect to")
	f.StringVar(&pool, "pool", "perf", "KV pool to serve")
	f.StringVar(&prefetch, "prefetch", "off", "what EXISTS prefetches from the servers' KV disk tiers to DRAM: off, on, lmcache (also <chunk>kv_bytes for EXISTS <chunk>metadata; see docs/resp.md)")
	f.StringVar(&maxValue, "max-value", "64MiB", "largest SET value accepted (the data servers' --kv-max-value)")
	f.BoolVar(&plaintext, "resp-plaintext", false, "serve without TLS even when the cluster uses TLS (the token and values travel in clear)")
	return cmd
}

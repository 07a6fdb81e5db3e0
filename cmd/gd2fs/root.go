package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/tlsconf"
	"github.com/gd2fs/gd2fs/internal/units"
	"github.com/spf13/cobra"
)

type globals struct {
	master    string
	masterSet bool // --master or GD2FS_MASTER given
	token     string
	tokenFile string
	debug     bool
	// masterRetry and ioTimeout are client.Config's MasterRetry and
	// Timeout (docs/api.md, "Failover and timeouts").
	masterRetry, ioTimeout time.Duration
	tls                    tlsconf.Files
	// From tls, once the flags are parsed (nil: plain TCP and http://).
	serverTLS, clientTLS *tls.Config

	cluster string // the master's cluster name, once asked
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "gd2fs",
		Short: "gd2fs: distributed storage for LLM inference (model weights and KV cache)",
		Long: `gd2fs: distributed storage for LLM inference (model weights and KV cache).

Environment (each also a flag; a flag wins):
  GD2FS_MASTER        master URL(s), comma-separated; http(s)://host:port or gd2fs://host:port (--master)
  GD2FS_TOKEN_FILE    file holding the cluster token (--token-file)
  GD2FS_TOKEN         the cluster token itself (--token; a flag shows in ps)
  GD2FS_TLS_CERT      PEM certificate: served by master/server/up, presented by clients (--tls-cert)
  GD2FS_TLS_KEY       its private key (--tls-key)
  GD2FS_TLS_CA        CA bundle that verifies the cluster's certificates (--tls-ca)
  GD2FS_MASTER_RETRY  how long master calls retry while no master leads, e.g. 30s (--master-retry)
  GD2FS_IO_TIMEOUT    a data server silent this long counts as not answering (--io-timeout)
  HF_HUB_CACHE        local model cache of warmup and cache (--cache)
  AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION   S3 of model pull/link (--s3-*)

Exit status: 0 success; 1 failure (the message says why; kv exists: a key is not stored); 2 bad
usage (kv exists: could not ask). Shell completion, gd2fs:// paths included: gd2fs completion --help.`,
		Example: `  gd2fs up                                   # a whole cluster on this machine
  gd2fs cp ./model.safetensors gd2fs://local/models/m/model.safetensors
  gd2fs ls -l gd2fs://local/models/m
  gd2fs status`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.master, "master", envOr("GD2FS_MASTER", client.DefaultMaster), "master URL, or every master comma-separated (masters on PostgreSQL) (env GD2FS_MASTER)")
	pf := root.PersistentFlags()
	pf.DurationVar(&g.masterRetry, "master-retry", api.DefaultRetryFor, "keep retrying master calls this long while no master leads (a failover); 0: one try of each master (env GD2FS_MASTER_RETRY)")
	pf.DurationVar(&g.ioTimeout, "io-timeout", client.DefaultTimeout, "a data server that does not answer a request within this (plus 1s per 8 MiB) counts as not answering: reads go to another replica, writes fail (env GD2FS_IO_TIMEOUT)")
	// No default from GD2FS_TOKEN here: a flag's default is printed by
	// --help, and the token must never be (resolve reads the variable).
	pf.StringVar(&g.token, "token", "", "cluster token (env GD2FS_TOKEN; prefer --token-file or the variable: a flag shows in ps)")
	pf.StringVar(&g.tokenFile, "token-file", os.Getenv("GD2FS_TOKEN_FILE"), "read the cluster token from this file (env GD2FS_TOKEN_FILE)")
	pf.StringVar(&g.tls.Cert, "tls-cert", os.Getenv("GD2FS_TLS_CERT"), "PEM certificate: serve over TLS (master, server, up), or present it to servers that require client certificates")
	pf.StringVar(&g.tls.Key, "tls-key", os.Getenv("GD2FS_TLS_KEY"), "PEM private key of --tls-cert")
	pf.StringVar(&g.tls.CA, "tls-ca", os.Getenv("GD2FS_TLS_CA"), "PEM CA bundle to verify the cluster's certificates (default: system roots)")
	pf.BoolVar(&g.tls.VerifyClients, "tls-verify-clients", false, "master, server, up: require client certificates signed by --tls-ca (mutual TLS)")
	pf.BoolVar(&g.debug, "debug", false, "debug logging")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		g.masterSet = cmd.Flags().Changed("master") || os.Getenv("GD2FS_MASTER") != ""
		for _, v := range []struct {
			flag, env string
			dst       *time.Duration
		}{{"io-timeout", client.EnvIOTimeout, &g.ioTimeout}, {"master-retry", client.EnvMasterRetry, &g.masterRetry}} {
			if cmd.Flags().Changed(v.flag) {
				continue
			}
			if d, set, err := client.DurationEnv(v.env); err != nil {
				return err
			} else if set {
				*v.dst = d
			}
		}
		if cmd.Flags().Changed("token") {
			switch cmd.Name() {
			case "master", "server", "up": // long-running: the flag stays in ps for days
				fmt.Fprintln(os.Stderr, "gd2fs: warning: --token shows in every process listing of this machine; use --token-file or GD2FS_TOKEN")
			}
		}
		return g.resolve()
	}
	root.AddCommand(newUp(g), newMaster(g), newServer(g), newCp(g), newLs(g), newStat(g), newCat(g),
		newRm(g), newMv(g), newMkdir(g), newStatus(g), newKV(g), newModel(g), newSession(g), newWarmup(g), newCache(g), newRouter(g), newRESP(g), newMount(g), newUmount(g))
	markUsageErrors(root)
	addRemoteCompletion(g, root) // completion.go
	return root
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func (g *globals) logger() *slog.Logger {
	lvl := slog.LevelInfo
	if g.debug {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// resolve reads the token file and the TLS files named by the flags.
func (g *globals) resolve() error {
	if g.token == "" {
		g.token = os.Getenv("GD2FS_TOKEN")
	}
	if g.tokenFile != "" {
		b, err := os.ReadFile(g.tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		if g.token = strings.TrimSpace(string(b)); g.token == "" {
			return fmt.Errorf("--token-file %s is empty", g.tokenFile)
		}
	}
	var err error
	if g.serverTLS, err = g.tls.Server(); err != nil {
		return err
	}
	for _, p := range tlsconf.Problems(g.serverTLS, time.Now()) {
		fmt.Fprintln(os.Stderr, "gd2fs: warning: --tls-cert:", p)
	}
	if g.clientTLS, err = g.tls.Client(); err != nil {
		return err
	}
	// Talking TLS: default master URLs become https.
	tls := g.clientTLS != nil || g.serverTLS != nil
	g.master = normalizeMasters(g.master, tls) // masterurl.go
	if tls {
		g.master = strings.ReplaceAll(g.master, "http://", "https://")
	}
	return nil
}

func (g *globals) client() (*client.Client, error) {
	retry := g.masterRetry
	if retry == 0 {
		retry = -1 // one pass: client.Config's 0 means the default
	}
	plain, err := client.BoolEnv(client.EnvPlainHTTP)
	if err != nil {
		return nil, err
	}
	return client.New(client.Config{Master: g.master, Token: g.token, TLS: g.clientTLS, MasterRetry: retry, Timeout: g.ioTimeout, PlainHTTP: plain})
}

// withRemote parses a gd2fs URI, opens a client and calls fn with both.
func (g *globals) withRemote(uri string, fn func(c *client.Client, path string) error) error {
	if _, err := remotePath(uri); err != nil {
		return err
	}
	g.mastersFrom(uri)
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	p, err := g.remote(c, uri)
	if err != nil {
		return err
	}
	return fn(c, p)
}

// remote is remotePath that also checks the URI names the cluster the
// master serves, so gd2fs://prod/... never lands in a test cluster.
func (g *globals) remote(c *client.Client, uri string) (string, error) {
	u, err := api.ParseURI(uri)
	if err != nil {
		return "", err
	}
	p, name := u.Path, u.Cluster
	if name == "" { // gd2fs://host:port/path without ?cluster=: the master named is the cluster
		return p, nil
	}
	if g.cluster == "" {
		st, err := c.Status(context.Background())
		if err != nil {
			return "", err
		}
		if err := g.checkMaster(st); err != nil {
			return "", err
		}
		g.cluster = st.Cluster
	}
	if name != g.cluster {
		return "", fmt.Errorf("%s names cluster %q, but the master at %s serves cluster %q: fix the URI or --master", uri, name, g.master, g.cluster)
	}
	return p, nil
}

// eachRemote calls fn for every URI in uris with one client, stopping at the
// first error. All URIs are checked before anything is done.
func (g *globals) eachRemote(uris []string, fn func(c *client.Client, path string) error) error {
	for _, u := range uris {
		if _, err := remotePath(u); err != nil {
			return err
		}
	}
	if len(uris) > 0 {
		g.mastersFrom(uris[0])
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	paths := make([]string, len(uris))
	for i, u := range uris {
		p, err := g.remote(c, u)
		if err != nil {
			return err
		}
		paths[i] = p
	}
	for _, p := range paths {
		if err := fn(c, p); err != nil {
			return err
		}
	}
	return nil
}

// isRemote tells a gd2fs URI (or absolute namespace path after "gd2fs:") from a local path.
func isRemote(s string) bool { return strings.HasPrefix(s, "gd2fs://") }

// remotePath turns gd2fs://<cluster>/<path> (or the engine form
// gd2fs://<host:port>[,...]/<path>?cluster=<name>) into /<path>.
func remotePath(s string) (string, error) {
	if !isRemote(s) {
		return "", fmt.Errorf("%q is not a gd2fs URI: write gd2fs://<cluster>/<path>, e.g. gd2fs://local/models/m", s)
	}
	if !strings.Contains(strings.TrimPrefix(s, "gd2fs://"), "/") {
		s += "/"
	}
	u, err := api.ParseURI(s)
	return u.Path, err
}

// mastersFrom makes a URI of the engine form (which names its masters)
// choose the masters, unless --master or GD2FS_MASTER named them.
func (g *globals) mastersFrom(uri string) {
	u, err := api.ParseURI(uri)
	if err != nil || len(u.Masters) == 0 || g.masterSet {
		return
	}
	urls := make([]string, len(u.Masters))
	for i, m := range u.Masters {
		urls[i] = "http://" + m
	}
	g.master = strings.Join(urls, ",")
}

// parseSize reads 123, 64KiB, 16MiB, 8GiB, 2TiB (and KB/MB/GB/TB as powers of 10).
func parseSize(s string) (int64, error) { return units.ParseSize(s) }

// human writes n bytes as 1.5 GiB.
func human(n int64) string { return units.Human(n) }

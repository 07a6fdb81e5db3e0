package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/internal/netguard"
	"github.com/gd2fs/gd2fs/internal/router"
	"github.com/spf13/cobra"
)

func newRouter(g *globals) *cobra.Command {
	var listen, upstream, model, header, tenantHeader, keysFile string
	var decode, maxAnswer int64
	var timeout, bodyTimeout time.Duration
	var keyTenants, shared bool
	var maxConns int
	var engineFlags []string
	var engineName string
	var unsafeCount bool
	cmd := &cobra.Command{
		Use:   "router --upstream URL --model MODEL",
		Short: "OpenAI-compatible proxy that keeps each chat's KV cache in gd2fs (plans before, commits after)",
		Long: `Runs an OpenAI-compatible HTTP proxy in front of an engine (vLLM with its explicit-offloading KV
connector, or anything that honours kv_transfer_params the same way). For /v1/chat/completions
and /v1/completions with a session id (the X-Session-ID header, or the request's "user" field)
it tokenizes the prompt with the engine's /tokenize, plans in the vllm format with the token
ids (so stored KV is used only for the very tokens it was computed from), adds the
plan as kv_transfer_params, forwards the request (streaming included) and commits what the
engine reports it saved. Requests without a session pass through untouched. When the store
fails, the request goes on without kv_transfer_params: a chat never fails because of gd2fs.
A client's own kv_transfer_params are removed from every request: only the router's plans
reach the engine.

A session belongs to a tenant, so one caller cannot read or grow another's chat by naming its
session id. The tenant is the API key's entry in --keys-file (lines "API_KEY TENANT"; other
keys are refused with 401), or the --tenant-header a proxy in front sets after it authenticated
the caller, or with --tenant-from-key the API key's hash. A request without a tenant gets no
session unless --shared-sessions puts every caller in one namespace (one user, or callers that
trust each other). Prometheus metrics at /metrics (gd2fs_router_*).`,
		Example: `  gd2fs router --listen :8080 --upstream http://127.0.0.1:8000 --model llama-3-8b --keys-file /etc/gd2fs/router-keys
  curl -s localhost:8080/v1/chat/completions -H 'X-Session-ID: chat-42' -H 'Authorization: Bearer sk-alice' \
    -d '{"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}]}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if model == "" {
				return errors.New("router needs --model: the model whose KV layout is registered (gd2fs model layout set ...)")
			}
			var flags map[string]any
			for _, f := range engineFlags {
				if flags == nil {
					flags = map[string]any{}
				}
				if name, value, ok := strings.Cut(f, "="); ok {
					flags[name] = value
				} else {
					flags[name] = true
				}
			}
			if engineName != "vllm" && engineName != "sglang" {
				return fmt.Errorf("--engine %q: vllm or sglang", engineName)
			}
			up, err := url.Parse(upstream)
			if err != nil || up.Scheme == "" || up.Host == "" {
				return fmt.Errorf("--upstream %q: give the engine's base URL, e.g. http://127.0.0.1:8000", upstream)
			}
			var keys map[string]string
			if keysFile != "" {
				if keys, err = router.LoadKeys(keysFile); err != nil {
					return err
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			tcp, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("router: listen on %s: %w", listen, err)
			}
			ln := netguard.New(tcp, maxConns, g.logger())
			r := router.New(router.Config{Upstream: up, Model: model, Planner: c.Sessions(), SessionHeader: header,
				DecodeTokens: decode, Timeout: timeout, Flags: flags, Format: engineName, Log: g.logger(), BodyTimeout: bodyTimeout, MaxAnswer: maxAnswer,
				Keys: keys, TenantHeader: tenantHeader, KeyTenants: keyTenants, SharedSessions: shared, UnsafeCountOnly: unsafeCount})
			srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
			fmt.Fprintf(os.Stderr, "gd2fs router on http://%s -> %s (model %s, store %s)\n", ln.Addr(), up, model, g.master)
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				srv.Shutdown(sctx)
			}()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			// Serve returns as Shutdown begins; the answers in flight end
			// first, then the commits that run after them.
			<-stopped
			r.Wait()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":8080", "address to serve the OpenAI API on")
	f.StringVar(&upstream, "upstream", "http://127.0.0.1:8000", "the engine's base URL")
	f.StringVar(&model, "model", "", "model whose KV layout gd2fs has (gd2fs model layout set)")
	f.StringVar(&engineName, "engine", "vllm", "the engine behind: vllm or sglang (the plan format it gets)")
	f.StringArrayVar(&engineFlags, "engine-flag", nil, "NAME (true) or NAME=VALUE put in every plan's kvcache_params.flags, e.g. prefill-only (repeatable)")
	f.StringVar(&header, "session-header", "X-Session-ID", "header naming the session (else the request's \"user\" field)")
	f.Int64Var(&decode, "decode-tokens", 256, "generation room to plan when a request sets no max_tokens")
	f.BoolVar(&unsafeCount, "unsafe-count-only", false, "plan on /tokenize's count alone, for an engine that answers no token ids (unsafe: wrong KV after an edited message)")
	f.StringVar(&keysFile, "keys-file", "", "file of \"API_KEY TENANT\" lines: the tenant of each key; other keys are refused")
	f.StringVar(&tenantHeader, "tenant-header", "", "header naming the caller's tenant, set by an authenticating proxy in front")
	f.BoolVar(&keyTenants, "tenant-from-key", false, "each API key (its hash) is a tenant of its own")
	f.BoolVar(&shared, "shared-sessions", false, "requests without a tenant share one namespace of session ids (else they get no session)")
	f.IntVar(&maxConns, "max-conns", 4096, "open connections at most; past it new ones are closed")
	f.DurationVar(&bodyTimeout, "body-timeout", time.Minute, "longest time to receive a request's body")
	f.Int64Var(&maxAnswer, "max-answer", 16<<20, "longest non-streamed answer held to find what the engine saved; longer ones pass through uncommitted")
	f.DurationVar(&timeout, "store-timeout", 2*time.Second, "longest wait for the store per request before forwarding without cache")
	return cmd
}

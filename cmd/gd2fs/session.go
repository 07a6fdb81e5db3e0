package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

func newSession(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Explicit-mode KV sessions: plan before a request runs, commit after",
		Example: `  gd2fs session plan chat-42 --model llama-3-8b --prompt-tokens 8192 --prefix gd2fs://local/prefixes/sys
  gd2fs session commit chat-42 --plan 1234
  gd2fs session ls
  gd2fs session show chat-42
  gd2fs session fork chat-42 chat-42b
  gd2fs session rm chat-42`,
	}
	with := func(fn func(s *client.Sessions, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			return fn(c.Sessions(), cmd, args)
		}
	}
	var req client.PlanRequest
	var engineFlags []string
	plan := &cobra.Command{
		Use:   "plan SESSION",
		Short: "Ask which tokens are stored and where new KV goes (prints the plan as JSON)",
		Example: `  gd2fs session plan chat-42 --model llama-3-8b --prompt-tokens 8192
  gd2fs session plan chat-42 --model llama-3-8b --prompt-tokens 8192 --decode-tokens 512 --format vllm   # kvcache_params for vLLM
  gd2fs session plan chat-42 --model llama-3-8b --prompt-tokens 8192 --format vllm --engine-flag prefill-only
  gd2fs session plan chat-42 --model qwen --prompt-tokens 29 --format sglang   # SGLang's kvcache_params (register page_tokens 1)`,
		Args: cobra.ExactArgs(1),
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			for _, f := range engineFlags {
				if req.Flags == nil {
					req.Flags = map[string]any{}
				}
				name, value, ok := strings.Cut(f, "=")
				if !ok {
					req.Flags[name] = true
				} else {
					req.Flags[name] = value
				}
			}
			if req.Format == "vllm" || req.Format == "sglang" {
				p, err := s.PlanEngine(cmd.Context(), args[0], req)
				if err != nil {
					return err
				}
				return printJSON(p)
			}
			p, err := s.Plan(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			return printJSON(p)
		}),
	}
	pf := plan.Flags()
	pf.StringVar(&req.Model, "model", "", "model whose KV layout applies")
	pf.Int64Var(&req.PromptTokens, "prompt-tokens", 0, "tokens in the prompt")
	pf.Int64Var(&req.DecodeTokens, "decode-tokens", 0, "room for generated tokens in the fresh range")
	pf.StringSliceVar(&req.Prefixes, "prefix", nil, "shared prefix file(s), applied when the session is created")
	pf.BoolVar(&req.NewFile, "new-file", false, "put this turn's KV in a new file")
	pf.StringVar(&req.Format, "format", "", "gd2fs (default), vllm or sglang: whole blocks and kv_transfer_params's kvcache_params, kv_uris an engine can dial")
	pf.Int64Var(&req.LoadThreshold, "load-threshold", 0, "vllm format: load_threshold passed to the engine")
	pf.StringArrayVar(&engineFlags, "engine-flag", nil, "vllm format: NAME (true) or NAME=VALUE put in kvcache_params.flags, e.g. prefill-only (repeatable)")
	var planID int64
	var saved string
	commit := &cobra.Command{
		Use:   "commit SESSION --plan ID [--saved FILE]",
		Short: "Record a plan's fresh range as stored (after the engine wrote it), or what the engine saved of it",
		Example: `  gd2fs session commit chat-42 --plan 1234
  gd2fs session commit chat-42 --plan 1234 --saved response-kv-params.json   # the engine's kv_transfer_params
  echo '{"fresh_kvcache": []}' | gd2fs session commit chat-42 --plan 1234 --saved -   # it saved nothing`,
		Args: cobra.ExactArgs(1),
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			var out client.Session
			var err error
			if saved == "" {
				out, err = s.Commit(cmd.Context(), args[0], planID)
			} else {
				var segs []client.KVRange
				if segs, err = readSaved(saved); err != nil {
					return err
				}
				out, err = s.CommitSaved(cmd.Context(), args[0], planID, segs)
			}
			if err != nil {
				return err
			}
			fmt.Printf("session %s: %d tokens stored in %d ranges\n", out.ID, out.Tokens, len(out.Ranges))
			return nil
		}),
	}
	commit.Flags().Int64Var(&planID, "plan", 0, "plan id from 'session plan'")
	commit.Flags().StringVar(&saved, "saved", "", "JSON file (- for stdin) of what the engine saved: its kv_transfer_params, kvcache_params or a fresh_kvcache list")
	ls := &cobra.Command{
		Use:     "ls",
		Short:   "List sessions",
		Example: "  gd2fs session ls",
		Args:    cobra.NoArgs,
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tMODEL\tTOKENS\tOWNED BYTES\tLAST USED")
			after := ""
			for {
				page, err := s.List(cmd.Context(), after, 1000)
				if err != nil {
					return err
				}
				for _, x := range page {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", x.ID, x.Model, x.Tokens, human(x.Bytes), x.LastUsed.Format("2006-01-02 15:04:05"))
				}
				if len(page) < 1000 {
					return tw.Flush()
				}
				after = page[len(page)-1].ID
			}
		}),
	}
	show := &cobra.Command{
		Use:     "show SESSION",
		Short:   "Show a session's ranges",
		Example: "  gd2fs session show chat-42",
		Args:    cobra.ExactArgs(1),
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			x, err := s.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(x)
		}),
	}
	fork := &cobra.Command{
		Use:     "fork SESSION NEW",
		Short:   "Start a session sharing another's stored ranges (no bytes copied)",
		Example: "  gd2fs session fork chat-42 chat-42b",
		Args:    cobra.ExactArgs(2),
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			x, err := s.Fork(cmd.Context(), args[0], args[1])
			if err == nil {
				fmt.Printf("session %s: %d tokens shared with %s\n", x.ID, x.Tokens, args[0])
			}
			return err
		}),
	}
	rm := &cobra.Command{
		Use:     "rm SESSION...",
		Short:   "Delete sessions (their files go when no fork uses them)",
		Example: "  gd2fs session rm chat-42",
		Args:    cobra.MinimumNArgs(1),
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := s.Delete(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	var model string
	var tokens int64
	prefix := &cobra.Command{
		Use:     "prefix URI --model M --tokens N",
		Short:   "Register a file holding a shared prefix's KV (e.g. a system prompt)",
		Example: "  gd2fs cp ./sys.kv gd2fs://local/prefixes/sys && gd2fs session prefix gd2fs://local/prefixes/sys --model llama-3-8b --tokens 512",
		Args:    cobra.ExactArgs(1),
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			p, err := remotePath(args[0])
			if err != nil {
				return err
			}
			return s.RegisterPrefix(cmd.Context(), p, model, tokens)
		}),
	}
	prefix.Flags().StringVar(&model, "model", "", "model whose KV the file holds")
	prefix.Flags().Int64Var(&tokens, "tokens", 0, "tokens the file covers")
	cmd.AddCommand(plan, commit, ls, show, fork, rm, prefix)
	return cmd
}

// readSaved reads the segments an engine saved from a JSON file: its
// kv_transfer_params ({"kvcache_params": {...}}), the kvcache_params
// themselves, {"fresh_kvcache": [...]}, or a bare list.
func readSaved(name string) ([]client.KVRange, error) {
	var b []byte
	var err error
	if name == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, err
	}
	var list []client.KVRange
	if json.Unmarshal(b, &list) == nil {
		return list, nil
	}
	var doc struct {
		KVCacheParams *struct {
			Fresh *[]client.KVRange `json:"fresh_kvcache"`
		} `json:"kvcache_params"`
		Fresh *[]client.KVRange `json:"fresh_kvcache"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: not JSON of saved segments: %w", name, err)
	}
	switch {
	case doc.KVCacheParams != nil && doc.KVCacheParams.Fresh != nil:
		return *doc.KVCacheParams.Fresh, nil
	case doc.Fresh != nil:
		return *doc.Fresh, nil
	}
	return nil, fmt.Errorf("%s holds no fresh_kvcache: give the engine's kv_transfer_params, its kvcache_params or a list of segments", name)
}

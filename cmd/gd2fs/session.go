package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"

	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

func newSession(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Explicit-mode KV sessions: plan before a request runs, commit after",
		Example: `  gd2fs session plan chat-42 --model llama-3-8b --tokens prompt-ids.json --prefix gd2fs://local/prefixes/sys
  gd2fs session write chat-42 --plan 1234 ./fresh-kv.bin    # what an engine does between plan and commit
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
			return flagError(fn(c.Sessions(), cmd, args)) // flagnames.go
		}
	}
	var req client.PlanRequest
	var engineFlags []string
	var tokensFile, hashesFile string
	plan := &cobra.Command{
		Use:   "plan SESSION (--tokens FILE | --block-hashes FILE | --unsafe-count-only --prompt-tokens N)",
		Short: "Ask which tokens are stored and where new KV goes (prints the plan as JSON)",
		Long: `Ask which tokens are stored and where new KV goes (prints the plan as JSON).

The plan checks content: give the prompt's token ids (--tokens, a file or - for
stdin: a JSON list, the engine's /tokenize answer, or ids separated by spaces or
commas) or its block hashes (--block-hashes, as 'gd2fs session hashes' prints
them, with --prompt-tokens). The stored part is the longest prefix whose content
matches what the session stored. --unsafe-count-only plans on counts alone, as
before: a user's edit of an earlier message then gets KV of other text.`,
		Example: `  gd2fs session plan chat-42 --model llama-3-8b --tokens prompt-ids.json
  curl -s localhost:8000/tokenize -d '{"prompt":"Hello"}' | gd2fs session plan chat-42 --model llama-3-8b --tokens -
  gd2fs session plan chat-42 --model llama-3-8b --tokens ids.txt --decode-tokens 512 --format vllm   # kvcache_params for vLLM
  gd2fs session plan chat-42 --model llama-3-8b --prompt-tokens 8192 --block-hashes hashes.txt
  gd2fs session plan chat-42 --model llama-3-8b --prompt-tokens 8192 --unsafe-count-only         # no content check
  gd2fs session plan chat-42 --model llama-3-8b --tokens ids.txt --format vllm --engine-flag prefill-only
  gd2fs session plan chat-42 --model qwen --tokens ids.txt --format sglang   # SGLang's kvcache_params (register page_tokens 1)`,
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
			var err error
			switch {
			case tokensFile != "" && hashesFile != "":
				return fmt.Errorf("give --tokens or --block-hashes, not both")
			case tokensFile != "":
				if req.TokenIDs, err = readTokenIDs(tokensFile); err != nil {
					return err
				}
			case hashesFile != "":
				if req.BlockHashes, err = readBlockHashes(hashesFile); err != nil {
					return err
				}
			case !req.UnsafeCountOnly:
				return fmt.Errorf("a plan checks the prompt's content: give --tokens FILE (its token ids) or --block-hashes FILE; --unsafe-count-only plans on --prompt-tokens alone (wrong KV after an edited message)")
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
	pf.Int64Var(&req.PromptTokens, "prompt-tokens", 0, "tokens in the prompt (may be left out with --tokens)")
	pf.StringVar(&tokensFile, "tokens", "", "file (- for stdin) of the prompt's token ids: JSON list, /tokenize answer, or ids separated by spaces or commas")
	pf.StringVar(&hashesFile, "block-hashes", "", "file (- for stdin) of the prompt's block hashes ('gd2fs session hashes'), with --prompt-tokens")
	pf.BoolVar(&req.UnsafeCountOnly, "unsafe-count-only", false, "plan on --prompt-tokens alone, without checking content (unsafe: wrong KV after an edited message)")
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
			// The master says what is missing ("... Sync before commit", or
			// which bytes no server holds "... before commit"); from a shell
			// the step that writes them is session write.
			if err != nil && strings.Contains(err.Error(), "before commit") {
				return fmt.Errorf("%w (from the shell: gd2fs session write %s --plan %d FILE)", err, args[0], planID)
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
	var lsJSON bool
	ls := &cobra.Command{
		Use:     "ls",
		Short:   "List sessions",
		Example: "  gd2fs session ls\n  gd2fs session ls --json | jq -r '.[].id'",
		Args:    cobra.NoArgs,
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			all := []client.Session{}
			if !lsJSON {
				fmt.Fprintln(tw, "SESSION\tMODEL\tTOKENS\tOWNED BYTES\tLAST USED")
			}
			after := ""
			for {
				page, err := s.List(cmd.Context(), after, 1000)
				if err != nil {
					return err
				}
				for _, x := range page {
					if lsJSON {
						all = append(all, x)
						continue
					}
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", x.ID, x.Model, x.Tokens, human(x.Bytes), x.LastUsed.Format("2006-01-02 15:04:05"))
				}
				if len(page) < 1000 {
					if lsJSON {
						return printJSON(all)
					}
					return tw.Flush()
				}
				after = page[len(page)-1].ID
			}
		}),
	}
	ls.Flags().BoolVar(&lsJSON, "json", false, "print a JSON list (snake_case fields, as session show)")
	show := &cobra.Command{
		Use:     "show SESSION",
		Short:   "Show a session's ranges (JSON)",
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
	var model, prefixIDs string
	var tokens int64
	prefix := &cobra.Command{
		Use:   "prefix URI --model M (--token-ids FILE | --tokens N)",
		Short: "Register a file holding a shared prefix's KV (e.g. a system prompt)",
		Long: `Register a file holding a shared prefix's KV (e.g. a system prompt).

With --token-ids (the ids the KV was computed from) sessions created with the
prefix load it when their prompt starts with those ids. With --tokens N alone
the prefix is stored but its content unknown: only --unsafe-count-only plans
use it.`,
		Example: `  gd2fs cp ./sys.kv gd2fs://local/prefixes/sys && gd2fs session prefix gd2fs://local/prefixes/sys --model llama-3-8b --token-ids sys-ids.json
  gd2fs session prefix gd2fs://local/prefixes/sys --model llama-3-8b --tokens 512   # content unknown`,
		Args: cobra.ExactArgs(1),
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			p, err := remotePath(args[0])
			if err != nil {
				return err
			}
			if prefixIDs == "" {
				return s.RegisterPrefix(cmd.Context(), p, model, tokens)
			}
			ids, err := readTokenIDs(prefixIDs)
			if err != nil {
				return err
			}
			if tokens != 0 && tokens != int64(len(ids)) {
				return fmt.Errorf("--tokens %d but %s holds %d ids: leave --tokens out", tokens, prefixIDs, len(ids))
			}
			return s.RegisterPrefixIDs(cmd.Context(), p, model, ids)
		}),
	}
	prefix.Flags().StringVar(&model, "model", "", "model whose KV the file holds")
	prefix.Flags().Int64Var(&tokens, "tokens", 0, "tokens the file covers")
	prefix.Flags().StringVar(&prefixIDs, "token-ids", "", "file (- for stdin) of the token ids the prefix's KV was computed from")
	var pageTokens int
	hashes := &cobra.Command{
		Use:   "hashes --page-tokens N --tokens FILE",
		Short: "Print the block hashes of token ids, one a line (what a plan's --block-hashes takes)",
		Long: `Print the block hashes of token ids, one a line: per block of N tokens,
SHA-256(previous block's hash || the block's ids as little-endian uint32)[:16]
in hex, the first block's previous hash being 16 zero bytes and the last block
perhaps partial (docs/kv-cache.md "The content check"). Needs no cluster.`,
		Example: `  echo '[1, 2, 3, 4, 5]' | gd2fs session hashes --page-tokens 4 --tokens -`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if pageTokens < 1 {
				return fmt.Errorf("--page-tokens must be at least 1 (the model layout's page_tokens)")
			}
			if tokensFile == "" {
				return fmt.Errorf("give --tokens FILE (- for stdin) of token ids")
			}
			ids, err := readTokenIDs(tokensFile)
			if err != nil {
				return err
			}
			for _, h := range client.BlockHashes(ids, pageTokens) {
				fmt.Println(h)
			}
			return nil
		},
	}
	hashes.Flags().IntVar(&pageTokens, "page-tokens", 0, "tokens per block: the model layout's page_tokens")
	hashes.Flags().StringVar(&tokensFile, "tokens", "", "file (- for stdin) of token ids: JSON list, /tokenize answer, or ids separated by spaces or commas")
	cmd.AddCommand(plan, commit, ls, show, fork, rm, prefix, hashes, newSessionWrite(g))
	return cmd
}

// readInput reads a file, or stdin for "-".
func readInput(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

// readTokenIDs reads token ids: a JSON list, a JSON object with a "tokens"
// list (an engine's /tokenize answer), or numbers separated by spaces,
// commas or newlines.
func readTokenIDs(name string) ([]uint32, error) {
	b, err := readInput(name)
	if err != nil {
		return nil, err
	}
	var ids []uint32
	if t := strings.TrimSpace(string(b)); strings.HasPrefix(t, "[") || strings.HasPrefix(t, "{") {
		var doc struct {
			Tokens *[]uint32 `json:"tokens"`
		}
		if err := json.Unmarshal(b, &ids); err == nil {
			return ids, nil
		}
		if err := json.Unmarshal(b, &doc); err != nil || doc.Tokens == nil {
			return nil, fmt.Errorf("%s: not a JSON list of token ids (0 to 4294967295) nor an object with \"tokens\" (%v)", name, err)
		}
		return *doc.Tokens, nil
	}
	for _, f := range strings.FieldsFunc(string(b), func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
		id, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s: token id %q: want a number from 0 to 4294967295", name, f)
		}
		ids = append(ids, uint32(id))
	}
	return ids, nil
}

// readBlockHashes reads block hashes: a JSON list of strings or hashes
// separated by spaces, commas or newlines.
func readBlockHashes(name string) ([]client.BlockHash, error) {
	b, err := readInput(name)
	if err != nil {
		return nil, err
	}
	var out []client.BlockHash
	if strings.HasPrefix(strings.TrimSpace(string(b)), "[") {
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, fmt.Errorf("%s: not a JSON list of block hashes: %w", name, err)
		}
		return out, nil
	}
	for _, f := range strings.FieldsFunc(string(b), func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
		var h client.BlockHash
		if err := h.UnmarshalText([]byte(f)); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, h)
	}
	return out, nil
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

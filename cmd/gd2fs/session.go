package main

import (
	"fmt"
	"os"
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
	plan := &cobra.Command{
		Use:     "plan SESSION",
		Short:   "Ask which tokens are stored and where new KV goes (prints the plan as JSON)",
		Example: "  gd2fs session plan chat-42 --model llama-3-8b --prompt-tokens 8192",
		Args:    cobra.ExactArgs(1),
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
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
	var planID int64
	commit := &cobra.Command{
		Use:     "commit SESSION --plan ID",
		Short:   "Record a plan's fresh range as stored (after the engine wrote it)",
		Example: "  gd2fs session commit chat-42 --plan 1234",
		Args:    cobra.ExactArgs(1),
		RunE: with(func(s *client.Sessions, cmd *cobra.Command, args []string) error {
			out, err := s.Commit(cmd.Context(), args[0], planID)
			if err != nil {
				return err
			}
			fmt.Printf("session %s: %d tokens stored in %d ranges\n", out.ID, out.Tokens, len(out.Ranges))
			return nil
		}),
	}
	commit.Flags().Int64Var(&planID, "plan", 0, "plan id from 'session plan'")
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

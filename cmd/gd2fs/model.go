package main

import (
	"encoding/json"
	"os"

	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

func newModel(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Model weights (pull, link, inspect) and KV layouts",
		Example: `  gd2fs model pull s3://models/org/m gd2fs://local/models/org/m
  gd2fs model link s3://models/org/m gd2fs://local/models/org/m
  gd2fs model inspect gd2fs://local/models/org/m
  gd2fs model layout set llama-3-8b --layers 32 --kv-heads 8 --head-dim 128 --dtype bf16 --page-tokens 16 --layout layer_first`,
	}
	layout := &cobra.Command{Use: "layout", Short: "Set or show a model's KV layout"}
	var l client.Layout
	set := &cobra.Command{
		Use:   "set MODEL",
		Short: "Register a model's KV layout (bytes per token and every offset follow from it)",
		Example: `  gd2fs model layout set llama-3-8b --layers 32 --kv-heads 8 --head-dim 128 --dtype bf16 --page-tokens 16 --layout layer_first
  gd2fs model layout set llama-3-70b-tp4 --layers 80 --kv-heads 8 --head-dim 128 --dtype bf16 --page-tokens 16 --layout kv_first --tp-size 4`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			l.Model = args[0]
			if err := c.Sessions().SetLayout(cmd.Context(), l); err != nil {
				return flagError(err)
			}
			return printLayout(l)
		},
	}
	f := set.Flags()
	f.IntVar(&l.Layers, "layers", 0, "transformer layers")
	f.IntVar(&l.KVHeads, "kv-heads", 0, "KV heads (per tensor-parallel rank, if the KV is sharded)")
	f.IntVar(&l.HeadDim, "head-dim", 0, "head dimension")
	f.StringVar(&l.DType, "dtype", "bf16", "element type: fp32, fp16, bf16, fp8, int8")
	f.IntVar(&l.PageTokens, "page-tokens", 16, "tokens per page (the engine's block size)")
	f.StringVar(&l.Order, "layout", "layer_first", "byte layout: layer_first, page_first, kv_first (vLLM's explicit-offloading connector; SGLang's session cache with --page-tokens 1) or kv_inner (the newest vLLM branch)")
	f.IntVar(&l.TPSize, "tp-size", 1, "tensor-parallel ranks the engine shards KV heads over (a range holds one region per rank)")
	f.BoolVar(&l.Replicated, "replicated", false, "every rank holds the same KV (MLA): store it once")
	f.IntVar(&l.KVLayers, "kv-layers", 0, "layers that hold KV (hybrid models: the full-attention layers); default all")
	get := &cobra.Command{
		Use:     "get MODEL",
		Short:   "Show a model's KV layout",
		Example: "  gd2fs model layout get llama-3-8b",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			l, err := c.Sessions().Layout(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printLayout(l)
		},
	}
	layout.AddCommand(set, get)
	cmd.AddCommand(layout, newModelPull(g), newModelLink(g), newModelInspect(g))
	return cmd
}

// printLayout shows a layout with the sizes that follow from it.
func printLayout(l client.Layout) error {
	return printJSON(map[string]any{"model": l.Model, "token_bytes": l.TokenBytes(), "rank_token_bytes": l.RankTokenBytes(), "page_bytes": l.PageBytes(), "layout": l})
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

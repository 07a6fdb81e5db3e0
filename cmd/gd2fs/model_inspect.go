package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/weights"
	"github.com/gd2fs/gd2fs/safetensors"
	"github.com/spf13/cobra"
)

func newModelInspect(g *globals) *cobra.Command {
	var tensors, asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect gd2fs://CLUSTER/DIR",
		Short: "List a model's files and, for safetensors, tensors, dtypes, shapes and bytes",
		Long: `List a model's files and, for safetensors, tensors, dtypes, shapes and bytes.

Each file is "pulled" (copied in by model pull; its sha256 is recorded), "linked" (model link: its
bytes stay in S3 and servers fill chunks on first read) or "copied" (gd2fs cp).`,
		Example: "  gd2fs model inspect gd2fs://local/models/org/m\n  gd2fs model inspect --tensors gd2fs://local/models/org/m\n  gd2fs model inspect --json gd2fs://local/models/org/m | jq '.files[].dtype_bytes'",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withRemote(args[0], func(c *client.Client, dir string) error {
				m, err := inspectModel(cmd.Context(), c, dir, tensors)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(m)
				}
				printModel(m, tensors)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&tensors, "tensors", false, "list every tensor")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (snake_case fields)")
	return cmd
}

// inspectModel reads a model folder's files and their safetensors headers.
func inspectModel(ctx context.Context, c *client.Client, dir string, tensors bool) (modelJSON, error) {
	m := modelJSON{Dir: dir, Files: []modelFileJSON{}}
	files, err := c.Walk(ctx, dir)
	if err != nil {
		return m, err
	}
	for _, fi := range files {
		st, err := c.Stat(ctx, fi.Path)
		if err != nil {
			return m, err
		}
		mf := modelFileJSON{Path: strings.TrimPrefix(fi.Path, dir+"/"), Size: st.Size, Sealed: st.Sealed, SHA256: st.Attrs["sha256"], Kind: "copied"}
		switch {
		case st.Attrs[weights.LinkedAttr] != "" || (st.Attrs["source"] != "" && st.Attrs["sha256"] == ""):
			mf.Kind, mf.Source = "linked", st.Attrs["source"]
		case st.Attrs["sha256"] != "":
			mf.Kind = "pulled"
		}
		m.Bytes += st.Size
		if strings.HasSuffix(fi.Path, ".safetensors") && st.Sealed {
			f, err := c.Open(ctx, fi.Path)
			if err != nil {
				return m, err
			}
			h, err := safetensors.Parse(f, f.Size())
			if err != nil {
				mf.Error = err.Error()
			} else {
				mf.Tensors, mf.Header, mf.DTypes = len(h.Tensors), h.DataFrom, map[string]int64{}
				for _, t := range h.Tensors {
					mf.DTypes[t.DType] += t.Bytes()
					m.Parameters += t.Bytes() / safetensors.DTypeSize(t.DType)
					if tensors {
						mf.List = append(mf.List, tensorJSON{Name: t.Name, DType: t.DType, Shape: t.Shape, Bytes: t.Bytes()})
					}
				}
			}
		}
		m.Files = append(m.Files, mf)
	}
	return m, nil
}

func printModel(m modelJSON, tensors bool) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	for _, f := range m.Files {
		state := "complete"
		if !f.Sealed {
			state = "INCOMPLETE"
		}
		kind := f.Kind
		switch f.Kind {
		case "linked":
			kind = "linked to " + f.Source
		case "pulled":
			kind = "pulled, sha256 " + short(f.SHA256)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Path, human(f.Size), state, kind)
		if f.Error != "" {
			fmt.Fprintf(tw, "  ! %s\n", f.Error)
		}
		if f.DTypes == nil {
			continue
		}
		for _, t := range f.List {
			fmt.Fprintf(tw, "  %s\t%s\t%v\t%s\n", t.Name, t.DType, t.Shape, human(t.Bytes))
		}
		types := make([]string, 0, len(f.DTypes))
		for t := range f.DTypes {
			types = append(types, t)
		}
		sort.Strings(types)
		var parts []string
		for _, t := range types {
			parts = append(parts, t+" "+human(f.DTypes[t]))
		}
		fmt.Fprintf(tw, "  %d tensors\t%s\theader %s\t\n", f.Tensors, strings.Join(parts, ", "), human(f.Header))
	}
	tw.Flush()
	fmt.Printf("%d files, %s, %d parameters in safetensors\n", len(m.Files), human(m.Bytes), m.Parameters)
}

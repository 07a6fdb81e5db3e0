package main

import (
	"context"
	"path"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// Shell completion: cobra's `gd2fs completion bash|zsh|fish|powershell`
// writes the script; the commands that take gd2fs:// URIs complete them by
// asking the master for the directory being typed (docs/cli.md).

// completeRemote completes gd2fs:// URIs; local is whether a local path may
// stand there too (cp), so the shell completes files when no URI is begun.
func completeRemote(g *globals, local bool) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if !strings.HasPrefix(toComplete, "gd2fs://") && !strings.HasPrefix("gd2fs://", toComplete) {
			if local {
				return nil, cobra.ShellCompDirectiveDefault
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		// Completion runs without the persistent pre-run: read the token
		// and TLS files here.
		g.masterSet = cmd.Flags().Changed("master")
		if g.resolve() != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		g.masterRetry = -1
		c, err := g.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer c.Close()
		rest := strings.TrimPrefix(toComplete, "gd2fs://")
		i := strings.IndexByte(rest, '/')
		if i < 0 || !strings.HasPrefix(toComplete, "gd2fs://") { // the cluster name: the master's
			st, err := c.Status(ctx)
			if err != nil || st.Cluster == "" {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return []string{"gd2fs://" + st.Cluster + "/"}, cobra.ShellCompDirectiveNoSpace
		}
		head, p := "gd2fs://"+rest[:i], rest[i:] // p starts with /
		dir, base := path.Dir(p), path.Base(p)
		if strings.HasSuffix(p, "/") {
			dir, base = path.Clean(p), ""
		}
		es, err := c.List(ctx, dir)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, e := range es {
			name := path.Base(e.Path)
			if !strings.HasPrefix(name, base) {
				continue
			}
			full := head + path.Join(dir, name)
			if e.IsDir {
				full += "/"
			}
			out = append(out, full)
		}
		return out, cobra.ShellCompDirectiveNoSpace | cobra.ShellCompDirectiveNoFileComp
	}
}

// addRemoteCompletion sets completeRemote on the commands that take URIs.
func addRemoteCompletion(g *globals, root *cobra.Command) {
	remote := map[string]bool{"ls": false, "stat": false, "cat": false, "rm": false, "mkdir": false, "cp": true,
		"inspect": false, "warmup": false, "link": false, "pull": false}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if local, ok := remote[c.Name()]; ok && c.ValidArgsFunction == nil && c.Parent() != nil && c.Parent().Name() != "cache" {
			c.ValidArgsFunction = completeRemote(g, local)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Long = c.Short + `.

Commands, flags and gd2fs:// paths complete; a path is completed by asking the master (GD2FS_MASTER,
the token and TLS variables apply), which gets 3 seconds.`
			c.Example = `  source <(gd2fs completion bash)                   # this shell; add it to ~/.bashrc to keep it
  gd2fs completion zsh > "${fpath[1]}/_gd2fs"
  gd2fs ls gd2fs://local/mo<TAB>                    # -> gd2fs://local/models/`
		}
	}
}

// Package version says which gd2fs this is: the release in VERSION (the one
// source of the number; the Python wheel reads the same file), the commit it
// was built from, and the Go toolchain.
//
// The commit comes from -ldflags "-X github.com/gd2fs/gd2fs/internal/version.commit=<sha>"
// (scripts/image.sh and the Containerfile set it), else from the VCS stamp Go
// puts in the binary when it builds inside a git checkout with -buildvcs, else
// "unknown". -X ...version.release=<v> overrides VERSION for a build of a
// tag that has not bumped the file.
package version

import (
	_ "embed"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

//go:embed VERSION
var file string

// Set by -ldflags -X; empty when not.
var (
	release string
	commit  string
)

// Info is what a binary knows of its build.
type Info struct {
	Version string // e.g. 0.1.0
	Commit  string // full hash, or "unknown"; "+dirty" when built from a modified tree
	Go      string // e.g. go1.26.8
}

// Get reads the build's Info.
func Get() Info {
	in := Info{Version: strings.TrimSpace(file), Commit: commit, Go: runtime.Version()}
	if release != "" {
		in.Version = release
	}
	if in.Commit == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			var rev, dirty string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					if s.Value == "true" {
						dirty = "+dirty"
					}
				}
			}
			if rev != "" {
				in.Commit = rev + dirty
			}
		}
	}
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	return in
}

// Short is the commit's first 12 characters (or all of "unknown").
func (i Info) Short() string {
	c, dirty, _ := strings.Cut(i.Commit, "+")
	if len(c) > 12 {
		c = c[:12]
	}
	if dirty != "" {
		c += "+" + dirty
	}
	return c
}

// String is the line `gd2fs --version` prints after "gd2fs ".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, i.Short(), i.Go)
}

// Collector is the gd2fs_build_info gauge (always 1, the build in its
// labels), registered by the master and every server so that a dashboard
// can show which versions a cluster runs during a rolling upgrade.
func Collector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "gd2fs_build_info",
		Help:        "The gd2fs build: version, commit and Go version in the labels; always 1.",
		ConstLabels: prometheus.Labels{"version": i.Version, "commit": i.Short(), "goversion": i.Go}})
	g.Set(1)
	return g
}

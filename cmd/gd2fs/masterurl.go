package main

import (
	"fmt"
	"strings"

	"github.com/gd2fs/gd2fs/client"
)

// normalizeMasters accepts --master in the forms users bring: http(s)://
// URLs, and the gd2fs://host:port[,host:port...] form pygd2fs and engine
// kv_uris use (a path after it is ignored). tls picks the scheme of the
// gd2fs:// form.
func normalizeMasters(list string, tls bool) string {
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	var out []string
	for _, m := range strings.Split(list, ",") {
		m = strings.TrimSpace(m)
		switch {
		case m == "":
			continue
		case strings.HasPrefix(m, "gd2fs://"):
			hosts := strings.TrimPrefix(m, "gd2fs://")
			if i := strings.IndexAny(hosts, "/?"); i >= 0 {
				hosts = hosts[:i]
			}
			for _, h := range strings.Split(hosts, ",") {
				if h != "" {
					out = append(out, scheme+h)
				}
			}
			continue
		case !strings.Contains(m, "://"):
			m = scheme + m // host:port
		}
		out = append(out, m)
	}
	return strings.Join(out, ",")
}

// checkMaster refuses an answer to /v1/status that names no cluster: the
// URL reached an HTTP server that is not a gd2fs master.
func (g *globals) checkMaster(st client.Status) error {
	if st.Cluster == "" {
		return fmt.Errorf("%s answered, but it is not a gd2fs master (its /v1/status names no cluster): check --master or GD2FS_MASTER", g.master)
	}
	return nil
}

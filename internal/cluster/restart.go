package cluster

import (
	"context"
	"strings"

	"github.com/gd2fs/gd2fs/internal/node"
)

// RestartMaster stops the master and starts a new one on the same address
// and metadata store, as a restarted `gd2fs master` process would be: what
// the old one kept only in memory is gone, what it saved is loaded. The
// servers keep running and reach the new master at the same URL.
func (c *Cluster) RestartMaster(ctx context.Context) error {
	addr := strings.TrimPrefix(strings.TrimPrefix(c.Master.URL(), "http://"), "https://")
	c.cancel()
	c.Master.Close()
	<-c.done
	if err := c.Meta.Close(); err != nil {
		return err
	}
	cfg := c.cfg
	m, ms, err := node.NewMaster(ctx, node.Master{Listen: addr, Meta: cfg.Meta, Cluster: cfg.Cluster, Token: cfg.Token,
		DownAfter: cfg.DownAfter, RepairAfter: cfg.RepairAfter, SessionQuota: cfg.SessionQuota, Log: cfg.Log,
		TLS: cfg.TLS, ClientTLS: cfg.ClientTLS, MaxConns: cfg.MaxConns})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(context.Background())
	c.Master, c.Meta, c.cancel, c.done = m, ms, cancel, make(chan struct{})
	done := c.done
	go func() { m.Run(rctx); close(done) }()
	return nil
}

package cluster

import (
	"context"

	"github.com/gd2fs/gd2fs/internal/resp"
	"github.com/gd2fs/gd2fs/internal/server"
)

// addRESP starts server i's Redis-protocol front end when the cluster has
// them (Config.RESP).
func (c *Cluster) addRESP(i int, s *server.Server) error {
	if !c.cfg.RESP {
		return nil
	}
	addr := "127.0.0.1:0"
	if i < len(c.cfg.RESPAddrs) {
		addr = c.cfg.RESPAddrs[i]
	}
	r, err := resp.Attach(s, resp.AttachConfig{Listen: addr, Master: c.Master.URL(), Token: c.cfg.Token, TLS: c.cfg.ClientTLS, ServerTLS: c.cfg.TLS, Log: c.cfg.Log})
	if err != nil {
		return err
	}
	if err := r.SetPrefetch(c.cfg.RESPPrefetch); err != nil {
		r.Close()
		return err
	}
	go r.Serve(context.Background())
	for len(c.RESP) <= i {
		c.RESP = append(c.RESP, nil)
	}
	if old := c.RESP[i]; old != nil {
		old.Close()
	}
	c.RESP[i] = r
	return nil
}

// StopRESP closes server i's RESP front end (tests kill a server with it).
func (c *Cluster) StopRESP(i int) {
	if i < len(c.RESP) && c.RESP[i] != nil {
		c.RESP[i].Close()
		c.RESP[i] = nil
	}
}

func (c *Cluster) closeRESP() {
	for i := range c.RESP {
		c.StopRESP(i)
	}
}

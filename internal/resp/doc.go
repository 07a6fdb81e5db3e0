// Package resp serves gd2fs's hash-mode KV cache over the Redis protocol
// (RESP2 and RESP3), so redis-cli, redis-benchmark, redis-py and LMCache's
// redis:// and resp:// backends work against gd2fs unchanged.
//
// A Server parses requests (proto.go), runs Redis commands (commands.go,
// info.go) and writes replies (writer.go) against a Backend. The Backend
// used by gd2fs is Cluster: a data server serves the keys it owns from its
// own tiers, values going out from its DRAM pages without a copy; every
// other key is forwarded to its owner through the Go client's KV path, so
// any endpoint shows the whole key space. A stateless gateway is a Cluster
// without a local server.
//
// Differences from Redis (docs/resp.md): only strings; SET overwrites
// (write-once stays for the binary API) and refuses EX/PX since gd2fs
// does not expire keys; keys are 1 to 1024 bytes; MSET, MGET and
// MULTI/EXEC are not atomic; the AUTH password is the cluster token.
package resp

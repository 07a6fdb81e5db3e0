package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/mount"
	"github.com/gd2fs/gd2fs/internal/weights"
)

func newMount(g *globals) *cobra.Command {
	var o mount.Options
	var cacheDir, quota, blockSize, readAhead, chunkSize, memory, logFile string
	var background bool
	cmd := &cobra.Command{
		Use:   "mount gd2fs://CLUSTER/DIR MOUNTPOINT",
		Short: "Mount a gd2fs folder as a local file system (FUSE) that vLLM and PyTorch open and mmap",
		Long: `Mount a gd2fs folder as a local file system (FUSE), in the foreground until it is
unmounted (gd2fs umount MOUNTPOINT, or Ctrl-C / SIGTERM / SIGHUP here).

Sealed and linked files are read through the SDK in parallel pieces (linked files fill
from S3 once per cluster, on the servers); the kernel keeps their pages across opens, so
processes that mmap one file share one copy and read it from the cluster once.

With --cache, files read through the mount are also copied to that local folder (the
layout, quota and LRU of 'gd2fs warmup', crash-safe partial copies). Once a file is
complete there, new opens are FUSE passthrough files: the kernel reads and maps the local
copy directly (Linux 6.9+, as root). Where the kernel or the privileges lack passthrough,
hot files are served from the local copy on the plain FUSE path instead; the log says
which at start ("passthrough=on" or "passthrough=off" and why).

Writes: create a new file, write it sequentially, close: close seals it (cp, torch.save,
safetensors save_file). Overwriting a sealed file is EPERM, writing out of order
EOPNOTSUPP; rename is one step on the cluster once a file is closed (EBUSY while it is
being written); docs/mount.md has the table.
A writer killed by a signal leaves its file unsealed with the bytes it wrote (remove it
and write again). A file unlinked while processes here still read it is removed on the
cluster at their last close.

If the daemon is killed (kill -9), the mountpoint answers "Transport endpoint is not
connected" until 'gd2fs umount MOUNTPOINT' (or fusermount3 -u) clears it.`,
		Example: `  gd2fs mount --background gd2fs://local/models /mnt/models
  vllm serve /mnt/models/meta-llama/Llama-3-8B
  gd2fs mount --cache /nvme/gd2fs --cache-quota 500GiB gd2fs://prod/models /mnt/models
  gd2fs mount --read-only gd2fs://local/models /mnt/models
  gd2fs umount /mnt/models`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.BlockSize, err = parseSize(blockSize); err != nil {
				return fmt.Errorf("--block-size: %w", err)
			}
			if o.ReadAhead, err = parseSize(readAhead); err != nil {
				return fmt.Errorf("--read-ahead: %w", err)
			}
			if o.Memory, err = parseSize(memory); err != nil {
				return fmt.Errorf("--read-ahead-memory: %w", err)
			}
			if o.ChunkSize, err = parseSize(chunkSize); err != nil {
				return fmt.Errorf("--chunk-size: %w", err)
			}
			if cacheDir != "" {
				q, err := parseSize(quota)
				if err != nil {
					return fmt.Errorf("--cache-quota: %w", err)
				}
				o.Cache = &weights.Cache{Dir: cacheDir, Quota: q}
			}
			if st, err := os.Stat(args[1]); err != nil || !st.IsDir() {
				return fmt.Errorf("mountpoint %s is not a folder: mkdir -p %s first", args[1], args[1])
			}
			if background && os.Getenv(envMountDaemon) == "" {
				return startMountDaemon(args[1], logFile)
			}
			return g.withRemote(args[0], func(c *client.Client, p string) error {
				st, err := c.Stat(cmd.Context(), p)
				if err != nil {
					return err
				}
				if !st.IsDir {
					return fmt.Errorf("%s is a file: mount a folder", args[0])
				}
				o.Client, o.Root, o.Source, o.Log, o.Debug = c, p, args[0], g.logger(), g.debug && os.Getenv("GD2FS_FUSE_DEBUG") != ""
				// SIGHUP too: a foreground daemon whose terminal closes
				// would otherwise die with its mount left in the mount
				// table ("Transport endpoint is not connected"). Caught
				// before mounting, so a signal sent as soon as "mounted"
				// is logged (or during the mount) still unmounts; it used
				// to be registered after the log line, and an early
				// SIGHUP killed the daemon.
				sig := make(chan os.Signal, 1)
				signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
				defer signal.Stop(sig)
				m, err := mount.Mount(args[1], o)
				if err != nil {
					return err
				}
				pt, why := m.Passthrough()
				if pt {
					o.Log.Info("mounted", "source", args[0], "mountpoint", m.Dir(), "passthrough", "on", "cache", cacheDir)
				} else {
					o.Log.Info("mounted", "source", args[0], "mountpoint", m.Dir(), "passthrough", "off", "why", why, "cache", cacheDir)
				}
				done := make(chan struct{})
				go func() { m.Wait(); close(done) }()
				for {
					select {
					case <-done:
						o.Log.Info("unmounted", "mountpoint", m.Dir())
						return nil
					case s := <-sig:
						if err := m.Unmount(false); err != nil {
							// Open files: detach now, serve them until closed.
							o.Log.Warn("files are open: detaching the mountpoint; serving them until they are closed", "signal", s.String())
							if err := m.Unmount(true); err != nil {
								return err
							}
						}
					}
				}
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&cacheDir, "cache", "", "local hot tier: copy files read through the mount into this folder (the layout of gd2fs warmup) and serve them from it")
	f.StringVar(&quota, "cache-quota", "0", "size limit of --cache; least recently used models no process has open are evicted (0: none)")
	f.BoolVar(&o.NoPassthrough, "no-passthrough", false, "serve hot files on the plain FUSE path even where the kernel offers passthrough")
	f.BoolVar(&background, "background", false, "return once mounted, leaving the daemon running (its log in --log-file)")
	f.StringVar(&logFile, "log-file", "", "with --background: the daemon's log (default: gd2fs-mount-<mountpoint>.log in the temporary folder)")
	f.BoolVar(&o.ReadOnly, "read-only", false, "mount read-only: every write answers EROFS")
	f.BoolVar(&o.AllowOther, "allow-other", false, "let users other than the one mounting use the mount")
	f.StringVar(&o.Pool, "pool", "", "pool of files created through the mount (default: the cluster's default, ha)")
	f.StringVar(&chunkSize, "chunk-size", "0", "chunk size of files created through the mount (0: the cluster's default)")
	f.DurationVar(&o.AttrTimeout, "attr-timeout", time.Minute, "how long the kernel caches a sealed file's name and attributes")
	f.DurationVar(&o.DirTimeout, "dir-timeout", time.Second, "how long the kernel caches folders and files still being written")
	f.StringVar(&blockSize, "block-size", "4MiB", "unit read from the servers")
	f.StringVar(&readAhead, "read-ahead", "64MiB", "how far ahead of a sequential reader the mount fetches (and the kernel reads ahead)")
	f.StringVar(&memory, "read-ahead-memory", "1GiB", "bytes of blocks fetched ahead, all files together")
	return cmd
}

func newUmount(g *globals) *cobra.Command {
	var lazy bool
	cmd := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a gd2fs mount, also one whose daemon was killed",
		Long: `Unmount a gd2fs mount. With files open under it the unmount is refused (fuser -vm
MOUNTPOINT lists the processes) unless --lazy, which detaches the mountpoint at once: open
files keep working until they are closed, then the daemon exits. A mountpoint left by a
killed daemon ("Transport endpoint is not connected") is cleared the same way.`,
		Example: `  gd2fs umount /mnt/models
  gd2fs umount --lazy /mnt/models`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return mount.Unmount(args[0], lazy)
		},
	}
	cmd.Flags().BoolVar(&lazy, "lazy", false, "detach even while files are open (they keep working until closed)")
	return cmd
}

const envMountDaemon = "GD2FS_MOUNT_DAEMON"

// startMountDaemon runs this same command again without --background, in
// its own session with its log in a file, and returns once the mountpoint
// is mounted (or with the daemon's log when it fails first).
func startMountDaemon(mountpoint, logFile string) error {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	if logFile == "" {
		logFile = filepath.Join(os.TempDir(), "gd2fs-mount-"+strings.ReplaceAll(strings.Trim(abs, "/"), "/", "-")+".log")
	}
	lf, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("--log-file: %w", err)
	}
	defer lf.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var args []string
	for _, a := range os.Args[1:] {
		if a != "--background" && a != "--background=true" {
			args = append(args, a)
		}
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), envMountDaemon+"=1")
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(2 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logFile)
			return fmt.Errorf("the mount daemon exited (%v) before mounting; its log (%s) ends:\n%s", err, logFile, tail(string(b), 20))
		case <-deadline:
			return fmt.Errorf("not mounted after 2 minutes; the daemon (pid %d) logs to %s", cmd.Process.Pid, logFile)
		case <-tick.C:
			if isMounted(abs) {
				fmt.Printf("mounted on %s: daemon pid %d, log %s; gd2fs umount %s to stop it\n", abs, cmd.Process.Pid, logFile, abs)
				return nil
			}
		}
	}
}

// isMounted reports whether a gd2fs FUSE file system is mounted at dir.
func isMounted(dir string) bool {
	b, _ := os.ReadFile("/proc/self/mounts")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[1] == dir && f[2] == "fuse.gd2fs" {
			return true
		}
	}
	return false
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

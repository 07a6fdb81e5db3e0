// Command gd2fs runs a gd2fs master, data server or a whole local cluster,
// and is the command-line client. Each subcommand lives in its own file.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "gd2fs:", err)
		os.Exit(1)
	}
}

package integration

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/testkit"
)

// helperMain is a second client process. By default it reads the file
// named in HOARD_TEST_FILE (earning a callback promise), says "ready", and
// waits to be stopped or killed: a client that stops answering. With
// HOARD_TEST_WRITE=N it instead writes N bytes of pattern 9 to the file and
// closes it (under a write delegation the data stays in its cache), says
// "ready", and on a line "sync" on its input opens the file again and
// reports what fsync and close say: a client that lost its lease, or dies,
// with dirty data.
func helperMain() int {
	c, err := cellDial(client.Options{Server: os.Getenv("HOARD_TEST_SERVER"), CacheDir: os.Getenv("HOARD_TEST_CACHE"), DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	name := os.Getenv("HOARD_TEST_FILE")
	if size, _ := strconv.Atoi(os.Getenv("HOARD_TEST_WRITE")); size > 0 {
		return helperWriter(c, name, size)
	}
	f, err := c.Open(name, os.O_RDONLY, 0)
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	if _, err := io.ReadAll(f); err != nil {
		fmt.Println("read:", err)
		return 1
	}
	f.Close()
	fmt.Println("ready")
	time.Sleep(time.Hour)
	return 0
}

func helperWriter(c *pathfs.FS, name string, size int) int {
	f, err := c.Create(name)
	if err != nil {
		fmt.Println("create:", err)
		return 1
	}
	if _, err := f.Write(testkit.Pattern(size, 9)); err != nil {
		fmt.Println("write:", err)
		return 1
	}
	if err := f.Close(); err != nil {
		fmt.Println("close:", err)
		return 1
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() != "sync" {
			continue
		}
		f, err := c.Open(name, os.O_WRONLY, 0)
		if err != nil {
			fmt.Println("open:", err)
			continue
		}
		fmt.Println("sync:", f.Sync())
		fmt.Println("close:", f.Close())
	}
	return 0
}

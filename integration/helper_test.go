package integration

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hoardfs/hoard/client"
)

// helperMain is a second client process: it reads the file named in
// HOARD_TEST_FILE (earning a callback promise), says "ready", and waits to
// be stopped or killed. Tests use it as a client that stops answering.
func helperMain() int {
	c, err := client.Dial(client.Options{Server: os.Getenv("HOARD_TEST_SERVER"), DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	f, err := c.Open(os.Getenv("HOARD_TEST_FILE"), os.O_RDONLY, 0)
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

// Command hello prints its greeting: TestBuild's binary.
package main

import "fmt"

var greeting = "hello"

func main() { fmt.Println(greeting) }

// A client for the daemon's socket using only Node's `net` and JSON, as an
// agent server written in TypeScript would. It pipelines three requests on one
// connection and prints each response line as it arrives, then closes.
//
// Usage: node node_client.js SOCKET_PATH
"use strict";

const net = require("net");

const socketPath = process.argv[2];
if (!socketPath) {
  console.error("usage: node node_client.js SOCKET_PATH");
  process.exit(2);
}

const requests = [
  { jsonrpc: "2.0", id: 1, method: "sleep", params: { s: 0.2 } },
  { jsonrpc: "2.0", id: 2, method: "echo", params: { text: "hello \u00e9\u2603" } },
  { jsonrpc: "2.0", id: 3, method: "no_such_method" },
];

const socket = net.createConnection(socketPath);
socket.setEncoding("utf8");
let buffered = "";
let answered = 0;

socket.on("connect", () => {
  socket.write(requests.map((r) => JSON.stringify(r) + "\n").join(""));
});

socket.on("data", (chunk) => {
  buffered += chunk;
  let end;
  while ((end = buffered.indexOf("\n")) >= 0) {
    const line = buffered.slice(0, end);
    buffered = buffered.slice(end + 1);
    const response = JSON.parse(line);
    process.stdout.write(JSON.stringify(response) + "\n");
    answered += 1;
    if (answered === requests.length) {
      socket.end();
    }
  }
});

socket.on("error", (err) => {
  console.error(`socket error: ${err.message}`);
  process.exit(1);
});

socket.on("close", () => {
  process.exit(answered === requests.length ? 0 : 1);
});

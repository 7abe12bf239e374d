// Connect to the socket with the Node package COUNT times and ping; print one
// JSON line per attempt: {"pid": N} for an answer, else {"error": class, "message"}.
//
// Usage: node node_attempts.mjs SOCKET_PATH COUNT

import { connect } from "../clients/node/src/index.js";

const [socketPath, count] = process.argv.slice(2);
for (let n = 0; n < Number(count); n++) {
  let line;
  try {
    const sd = await connect({ socket: socketPath, connectTimeoutMs: 2000 });
    const { pid, saved } = await sd.ping();
    line = { pid, saved };
    sd.destroy();
  } catch (error) {
    line = { error: error.constructor.name, message: error.message };
  }
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

// The official MCP SDK's client against `context-sidecar mcp` over stdio: every reply is checked by the
// SDK's own schemas (zod) as Claude Code's client would check it. Usage: node sdk-client.mjs COMMAND ARGS…
// Exits 0 when every check passed; prints one line per check.
import { pathToFileURL } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ListRootsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [command, ...args] = process.argv.slice(2);
let failed = 0;
function check(name, ok, detail = "") {
  console.log(`${ok ? "PASS" : "FAIL"} sdk-stdio ${name}${detail ? `: ${detail}` : ""}`);
  if (!ok) failed += 1;
}

const client = new Client({ name: "sdk-check", version: "1" }, { capabilities: { roots: { listChanged: true } } });
let rootsAsked = 0;
client.setRequestHandler(ListRootsRequestSchema, async () => {
  rootsAsked += 1;
  return { roots: [{ uri: pathToFileURL(process.cwd()).href, name: "workspace" }] };
});
// The SDK passes a stdio server only HOME, PATH, … by default; the whole environment keeps the runner's
// XDG_RUNTIME_DIR, so the server finds the host the bridge's servers started instead of starting its own.
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
try {
  await client.connect(transport);
  check("initialize", client.getServerVersion()?.name === "context-sidecar", JSON.stringify(client.getServerVersion()));
  check("ping", JSON.stringify(await client.ping()) === "{}");
  const { tools } = await client.listTools();
  const names = tools.map((tool) => tool.name).join(",");
  check("tools/list", names === "memory_grep,memory_describe,memory_expand,memory_query", names);
  check("tools/list readOnlyHint", tools.every((tool) => tool.annotations?.readOnlyHint === true));
  const found = await client.callTool({ name: "memory_grep", arguments: { pattern: "conformance" } });
  check("tools/call result", found.isError === false && found.content[0].type === "text", found.content[0]?.text);
  const wrong = await client.callTool({ name: "memory_grep", arguments: {} });
  check("tools/call bad arguments is isError", wrong.isError === true && wrong.content[0].text.startsWith("Error:"));
  try {
    await client.callTool({ name: "no_such_tool", arguments: {} });
    check("tools/call unknown tool is -32602", false, "no error");
  } catch (error) {
    check("tools/call unknown tool is -32602", error.code === -32602, String(error));
  }
  check("roots/list asked", rootsAsked >= 1, `${rootsAsked} times`);
  await client.setLoggingLevel("warning");
  check("logging/setLevel", true);
  await client.sendRootsListChanged();
  await client.ping();
  check("roots/list asked again after list_changed", rootsAsked >= 2, `${rootsAsked} times`);
} catch (error) {
  check("no exception", false, String(error?.stack ?? error));
} finally {
  await client.close();
}
process.exit(failed ? 1 : 0);

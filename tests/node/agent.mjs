// An agent loop on the openai npm package, pointed at loopwarden gateway
// (tests/test_gateway_node.py runs it).  No loopwarden code: only the base URL changes.
//
//   node agent.mjs BASE_URL MODEL USER [--stream]
//
// Runs the demo shop's lookups (small stand-ins written here: the loop is what is tested)
// until the model answers without tool calls, then prints one JSON line:
// {"steps", "answer", "stop", "calls"} and exits 0.  Any error exits 1.
import OpenAI from "openai";

const [baseURL, model, user, flag] = process.argv.slice(2);
const stream = flag === "--stream";

const tools = [
  ["query_order", "查询订单详情", { order_id: { type: "string" } }],
  ["query_logistics", "查询运单的物流轨迹", { tracking_no: { type: "string" } }],
  ["search_knowledge", "检索售后知识库", { query: { type: "string" } }],
  ["get_current_time", "当前时间", {}],
].map(([name, description, properties]) => ({
  type: "function",
  function: {
    name,
    description,
    parameters: { type: "object", properties, required: Object.keys(properties) },
  },
}));

function runTool(name, args) {
  switch (name) {
    case "query_order":
      return args.order_id === "88231"
        ? JSON.stringify({ order_id: "88231", status: "已签收", tracking_no: "SF1234567890" })
        : `NOT_FOUND: 订单 ${args.order_id} 不存在`;
    case "query_logistics":
      return JSON.stringify([{ at: "2026-06-22 14:05", event: "已签收，签收人：本人" }]);
    case "search_knowledge":
      return "7 天无理由退货：签收后 7 天内，商品完好即可申请。";
    case "get_current_time":
      return "2026-06-25 10:30:00";
    default:
      return `ERROR: unknown tool ${name}`;
  }
}

const client = new OpenAI({ baseURL, apiKey: "sk-test-node", maxRetries: 0, timeout: 30_000 });
const messages = [{ role: "user", content: process.env.AGENT_TASK ?? "查询订单 99999 的状态" }];
let calls = 0;

for (let step = 1; step <= 40; step++) {
  let text = "";
  let toolCalls = [];
  let stop = null;
  if (stream) {
    const { data, response } = await client.chat.completions
      .create({ model, messages, tools, user, stream: true })
      .withResponse();
    stop = response.headers.get("x-loopwarden-stop");
    const acc = new Map();
    for await (const chunk of data) {
      const delta = chunk.choices[0]?.delta;
      if (!delta) continue;
      text += delta.content ?? "";
      for (const tc of delta.tool_calls ?? []) {
        const slot = acc.get(tc.index) ?? { id: "", name: "", args: "" };
        slot.id = tc.id ?? slot.id;
        slot.name += tc.function?.name ?? "";
        slot.args += tc.function?.arguments ?? "";
        acc.set(tc.index, slot);
      }
    }
    toolCalls = [...acc.values()].map((c) => ({
      id: c.id,
      type: "function",
      function: { name: c.name, arguments: c.args },
    }));
  } else {
    const { data, response } = await client.chat.completions
      .create({ model, messages, tools, user })
      .withResponse();
    stop = response.headers.get("x-loopwarden-stop");
    const msg = data.choices[0].message;
    text = msg.content ?? "";
    toolCalls = msg.tool_calls ?? [];
  }
  messages.push({
    role: "assistant",
    content: text || null,
    ...(toolCalls.length ? { tool_calls: toolCalls } : {}),
  });
  if (!toolCalls.length) {
    console.log(JSON.stringify({ steps: step, answer: text, stop, calls }));
    process.exit(0);
  }
  for (const tc of toolCalls) {
    calls++;
    const out = runTool(tc.function.name, JSON.parse(tc.function.arguments || "{}"));
    messages.push({ role: "tool", tool_call_id: tc.id, content: out });
  }
}
console.error("the agent loop never ended");
process.exit(1);

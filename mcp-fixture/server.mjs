#!/usr/bin/env node
// mcp-fixture: a small MCP server used as the gateway's test upstream.
//
// What it does: serves the tools, resources and prompts the conformance suite's server
// scenarios call (names and payloads as the suite's scenario texts require), plus
// `progress_stream`, a tool that sends `count` progress notifications `interval_ms` apart,
// each carrying its 1-based sequence number, so tests can check exactly-once delivery.
// Transports: stdio (default) — one client per process, as the gateway runs it; or, with
// `--http PORT`, streamable HTTP on 127.0.0.1 WITHOUT resumability (no event store), one
// server instance per session, to act as an `--upstream-url` that cannot resume by itself.
// What it does not do: persist anything, implement the 2026-07-28 (modern) era, or auth.
// Written against the SDK's low-level `Server` API (no zod schemas of our own).

import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListResourcesRequestSchema,
  ListToolsRequestSchema,
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  isInitializeRequest,
} from '@modelcontextprotocol/sdk/types.js';
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';

// 1x1 PNG and a minimal WAV, base64 (the suite only checks type and mimeType).
const PNG_B64 =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
const WAV_B64 = 'UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=';

// Limits for progress_stream, so a test cannot wedge the fixture.
const PROGRESS_COUNT_MAX = 100000;
const PROGRESS_INTERVAL_MS_MAX = 60000;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const noArgs = { type: 'object', properties: {} };

const TOOLS = [
  { name: 'test_simple_text', description: 'Returns one text content item', inputSchema: noArgs },
  { name: 'test_image_content', description: 'Returns one image content item', inputSchema: noArgs },
  { name: 'test_audio_content', description: 'Returns one audio content item', inputSchema: noArgs },
  { name: 'test_embedded_resource', description: 'Returns an embedded resource', inputSchema: noArgs },
  { name: 'test_multiple_content_types', description: 'Returns text, image and resource', inputSchema: noArgs },
  { name: 'test_tool_with_logging', description: 'Sends three log notifications while running', inputSchema: noArgs },
  { name: 'test_tool_with_progress', description: 'Sends three progress notifications while running', inputSchema: noArgs },
  { name: 'test_error_handling', description: 'Returns a tool error (isError: true)', inputSchema: noArgs },
  {
    name: 'test_reconnection',
    description: 'Answers after a pause; over HTTP it first closes the SSE stream so the client must resume',
    inputSchema: noArgs,
  },
  {
    name: 'test_sampling',
    description: 'Asks the client for an LLM completion (sampling/createMessage)',
    inputSchema: { type: 'object', properties: { prompt: { type: 'string' } }, required: ['prompt'] },
  },
  {
    name: 'test_elicitation',
    description: 'Asks the client for user input (elicitation/create)',
    inputSchema: { type: 'object', properties: { message: { type: 'string' } }, required: ['message'] },
  },
  { name: 'test_elicitation_sep1034_defaults', description: 'Elicitation with defaults (SEP-1034)', inputSchema: noArgs },
  { name: 'test_elicitation_sep1330_enums', description: 'Elicitation with enum variants (SEP-1330)', inputSchema: noArgs },
  {
    name: 'json_schema_2020_12_tool',
    description: 'Tool whose input schema uses JSON Schema 2020-12 features (SEP-1613)',
    inputSchema: {
      $schema: 'https://json-schema.org/draft/2020-12/schema',
      type: 'object',
      $defs: {
        address: { type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } },
      },
      properties: { name: { type: 'string' }, address: { $ref: '#/$defs/address' } },
      additionalProperties: false,
    },
  },
  {
    name: 'progress_stream',
    description:
      'Sends `count` progress notifications `interval_ms` apart (message "seq <n>"), then returns the count',
    inputSchema: {
      type: 'object',
      properties: {
        count: { type: 'integer', minimum: 0, maximum: PROGRESS_COUNT_MAX },
        interval_ms: { type: 'integer', minimum: 0, maximum: PROGRESS_INTERVAL_MS_MAX },
      },
      required: ['count'],
    },
  },
];

const RESOURCES = [
  { uri: 'test://static-text', name: 'static-text', title: 'Static Text Resource', mimeType: 'text/plain' },
  { uri: 'test://static-binary', name: 'static-binary', title: 'Static Binary Resource', mimeType: 'image/png' },
  { uri: 'test://watched-resource', name: 'watched-resource', title: 'Watched Resource', mimeType: 'text/plain' },
];

const PROMPTS = [
  { name: 'test_simple_prompt', title: 'Simple Test Prompt', description: 'A prompt without arguments' },
  {
    name: 'test_prompt_with_arguments',
    description: 'A prompt with two required arguments',
    arguments: [
      { name: 'arg1', description: 'First test argument', required: true },
      { name: 'arg2', description: 'Second test argument', required: true },
    ],
  },
  {
    name: 'test_prompt_with_embedded_resource',
    description: 'A prompt that embeds a resource',
    arguments: [{ name: 'resourceUri', description: 'URI of the resource to embed', required: true }],
  },
  { name: 'test_prompt_with_image', description: 'A prompt that includes an image' },
];

const text = (t) => ({ content: [{ type: 'text', text: t }] });

function intArg(args, name, dflt, max) {
  const v = args?.[name] ?? dflt;
  if (!Number.isInteger(v) || v < 0 || v > max) {
    throw new Error(`argument ${name} must be an integer in 0..=${max}, got ${JSON.stringify(v)}`);
  }
  return v;
}

// Builds one MCP server instance (one per client: stdio process or HTTP session).
function buildServer() {
  const server = new Server(
    { name: 'mcp-fixture', version: '0.1.0' },
    {
      capabilities: {
        tools: { listChanged: true },
        resources: { subscribe: true, listChanged: true },
        prompts: { listChanged: true },
        logging: {},
        completions: {},
      },
    },
  );
  const subscriptions = new Set();

  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const { name, arguments: args = {} } = request.params;
    const progressToken = request.params._meta?.progressToken;
    const note = (method, params) => extra.sendNotification({ method, params });
    switch (name) {
      case 'test_simple_text':
        return text('This is a simple text response for testing.');
      case 'test_image_content':
        return { content: [{ type: 'image', data: PNG_B64, mimeType: 'image/png' }] };
      case 'test_audio_content':
        return { content: [{ type: 'audio', data: WAV_B64, mimeType: 'audio/wav' }] };
      case 'test_embedded_resource':
        return {
          content: [
            {
              type: 'resource',
              resource: { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' },
            },
          ],
        };
      case 'test_multiple_content_types':
        return {
          content: [
            { type: 'text', text: 'Multiple content types test:' },
            { type: 'image', data: PNG_B64, mimeType: 'image/png' },
            {
              type: 'resource',
              resource: { uri: 'test://mixed-content-resource', mimeType: 'application/json', text: '{"test":"data","value":123}' },
            },
          ],
        };
      case 'test_tool_with_logging':
        for (const [i, msg] of ['Tool execution started', 'Tool processing data', 'Tool execution completed'].entries()) {
          if (i > 0) await sleep(50);
          await note('notifications/message', { level: 'info', data: msg });
        }
        return text('Tool with logging executed successfully');
      case 'test_tool_with_progress': {
        const token = progressToken ?? 0;
        for (const [i, p] of [0, 50, 100].entries()) {
          if (i > 0) await sleep(50);
          await note('notifications/progress', { progressToken: token, progress: p, total: 100, message: `Completed step ${p} of 100` });
        }
        return text(String(token));
      }
      case 'test_error_handling':
        return { isError: true, content: [{ type: 'text', text: 'This tool intentionally returns an error for testing' }] };
      case 'test_reconnection':
        // Over HTTP the SDK can close this request's SSE stream; over stdio there is no stream
        // (the gateway decides when to close its connections).
        extra.closeSSEStream?.();
        await sleep(100);
        return text('Reconnection test completed successfully. If you received this, the client properly reconnected after stream closure.');
      case 'test_sampling': {
        const res = await extra.sendRequest(
          {
            method: 'sampling/createMessage',
            params: { messages: [{ role: 'user', content: { type: 'text', text: String(args.prompt ?? '') } }], maxTokens: 100 },
          },
          CreateMessageResultSchema,
        );
        return text(`LLM response: ${res.content?.text ?? 'No response'}`);
      }
      case 'test_elicitation':
      case 'test_elicitation_sep1034_defaults':
      case 'test_elicitation_sep1330_enums': {
        const res = await extra.sendRequest({ method: 'elicitation/create', params: elicitation(name, args) }, ElicitResultSchema);
        return text(`Elicitation completed: action=${res.action}, content=${JSON.stringify(res.content ?? {})}`);
      }
      case 'json_schema_2020_12_tool':
        return text(`JSON Schema 2020-12 tool called with: ${JSON.stringify(args)}`);
      case 'progress_stream': {
        const count = intArg(args, 'count', 0, PROGRESS_COUNT_MAX);
        const intervalMs = intArg(args, 'interval_ms', 10, PROGRESS_INTERVAL_MS_MAX);
        if (progressToken !== undefined) {
          for (let n = 1; n <= count; n++) {
            if (extra.signal.aborted) throw new Error(`cancelled after ${n - 1} notifications`);
            await note('notifications/progress', { progressToken, progress: n, total: count, message: `seq ${n}` });
            if (n < count && intervalMs > 0) await sleep(intervalMs);
          }
        }
        return { content: [{ type: 'text', text: `sent ${count}` }], structuredContent: { sent: progressToken === undefined ? 0 : count } };
      }
      default:
        return { isError: true, content: [{ type: 'text', text: `unknown tool: ${name}` }] };
    }
  });

  server.setRequestHandler(ListResourcesRequestSchema, async () => ({ resources: RESOURCES }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({
    resourceTemplates: [
      { uriTemplate: 'test://template/{id}/data', name: 'template', title: 'Resource Template', mimeType: 'application/json' },
    ],
  }));
  server.setRequestHandler(ReadResourceRequestSchema, async (request) => {
    const uri = request.params.uri;
    if (uri === 'test://static-text') {
      return { contents: [{ uri, mimeType: 'text/plain', text: 'This is the content of the static text resource.' }] };
    }
    if (uri === 'test://static-binary') return { contents: [{ uri, mimeType: 'image/png', blob: PNG_B64 }] };
    if (uri === 'test://watched-resource') return { contents: [{ uri, mimeType: 'text/plain', text: 'Watched resource content' }] };
    const m = /^test:\/\/template\/([^/]+)\/data$/.exec(uri);
    if (m) {
      const id = m[1];
      return { contents: [{ uri, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) }] };
    }
    const err = new Error(`Resource not found: ${uri}`);
    err.code = -32002;
    err.data = { uri };
    throw err;
  });
  server.setRequestHandler(SubscribeRequestSchema, async (request) => {
    subscriptions.add(request.params.uri);
    return {};
  });
  server.setRequestHandler(UnsubscribeRequestSchema, async (request) => {
    subscriptions.delete(request.params.uri);
    return {};
  });

  server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts: PROMPTS }));
  server.setRequestHandler(GetPromptRequestSchema, async (request) => {
    const { name, arguments: args = {} } = request.params;
    const user = (content) => ({ role: 'user', content });
    switch (name) {
      case 'test_simple_prompt':
        return { messages: [user({ type: 'text', text: 'This is a simple prompt for testing.' })] };
      case 'test_prompt_with_arguments':
        return { messages: [user({ type: 'text', text: `Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'` })] };
      case 'test_prompt_with_embedded_resource':
        return {
          messages: [
            user({ type: 'resource', resource: { uri: args.resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' } }),
            user({ type: 'text', text: 'Please process the embedded resource above.' }),
          ],
        };
      case 'test_prompt_with_image':
        return {
          messages: [
            user({ type: 'image', data: PNG_B64, mimeType: 'image/png' }),
            user({ type: 'text', text: 'Please analyze the image above.' }),
          ],
        };
      default:
        throw Object.assign(new Error(`unknown prompt: ${name}`), { code: -32602 });
    }
  });

  server.setRequestHandler(SetLevelRequestSchema, async () => ({}));
  server.setRequestHandler(CompleteRequestSchema, async () => ({ completion: { values: [], total: 0, hasMore: false } }));
  return server;
}

function elicitation(tool, args) {
  if (tool === 'test_elicitation') {
    return {
      mode: 'form',
      message: String(args.message ?? ''),
      requestedSchema: {
        type: 'object',
        properties: { response: { type: 'string', description: "User's response" } },
        required: ['response'],
      },
    };
  }
  if (tool === 'test_elicitation_sep1034_defaults') {
    return {
      mode: 'form',
      message: 'Please review and update the form fields with defaults',
      requestedSchema: {
        type: 'object',
        properties: {
          name: { type: 'string', description: 'User name', default: 'John Doe' },
          age: { type: 'integer', description: 'User age', default: 30 },
          score: { type: 'number', description: 'User score', default: 95.5 },
          status: { type: 'string', description: 'User status', enum: ['active', 'inactive', 'pending'], default: 'active' },
          verified: { type: 'boolean', description: 'Verification status', default: true },
        },
        required: [],
      },
    };
  }
  const titled = (prefix) => [1, 2, 3].map((i) => ({ const: `value${i}`, title: `${['First', 'Second', 'Third'][i - 1]} ${prefix}` }));
  return {
    mode: 'form',
    message: 'Please select options from the enum fields',
    requestedSchema: {
      type: 'object',
      properties: {
        untitledSingle: { type: 'string', description: 'Select one option', enum: ['option1', 'option2', 'option3'] },
        titledSingle: { type: 'string', description: 'Select one option with titles', oneOf: titled('Option') },
        legacyEnum: {
          type: 'string',
          description: 'Select one option (legacy)',
          enum: ['opt1', 'opt2', 'opt3'],
          enumNames: ['Option One', 'Option Two', 'Option Three'],
        },
        untitledMulti: {
          type: 'array',
          description: 'Select multiple options',
          minItems: 1,
          maxItems: 3,
          items: { type: 'string', enum: ['option1', 'option2', 'option3'] },
        },
        titledMulti: {
          type: 'array',
          description: 'Select multiple options with titles',
          minItems: 1,
          maxItems: 3,
          items: { anyOf: titled('Choice') },
        },
      },
      required: [],
    },
  };
}

// Streamable HTTP mode: one Server per session, no event store (so no resumability of its own).
async function serveHttp(port) {
  const sessions = new Map();
  const http = createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://127.0.0.1');
      if (url.pathname !== '/mcp') {
        res.writeHead(404).end();
        return;
      }
      let body;
      if (req.method === 'POST') {
        const chunks = [];
        for await (const c of req) chunks.push(c);
        try {
          body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        } catch {
          res.writeHead(400, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error' } }));
          return;
        }
      }
      const sid = req.headers['mcp-session-id'];
      let transport = sid ? sessions.get(sid) : undefined;
      if (!transport) {
        if (sid || req.method !== 'POST' || !isInitializeRequest(body)) {
          res.writeHead(sid ? 404 : 400, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: sid ? 'Session not found' : 'Missing session id' } }));
          return;
        }
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (id) => sessions.set(id, transport),
        });
        transport.onclose = () => transport.sessionId && sessions.delete(transport.sessionId);
        await buildServer().connect(transport);
      }
      await transport.handleRequest(req, res, body);
    } catch (e) {
      process.stderr.write(`mcp-fixture: http error: ${e?.stack ?? e}\n`);
      if (!res.headersSent) res.writeHead(500).end();
    }
  });
  await new Promise((resolve) => http.listen(port, '127.0.0.1', resolve));
  process.stderr.write(`mcp-fixture: streamable HTTP on http://127.0.0.1:${http.address().port}/mcp\n`);
  const stop = () => http.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

const argv = process.argv.slice(2);
const httpAt = argv.indexOf('--http');
if (argv.includes('--help')) {
  process.stdout.write('usage: server.mjs [--http PORT]   (default: stdio)\n');
} else if (httpAt >= 0) {
  const port = Number(argv[httpAt + 1]);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    process.stderr.write(`mcp-fixture: --http needs a port number, got ${argv[httpAt + 1]}\n`);
    process.exit(2);
  }
  await serveHttp(port);
} else {
  const server = buildServer();
  // stdin closed by the gateway = session over: exit (stdio shutdown per the lifecycle spec).
  server.onclose = () => process.exit(0);
  await server.connect(new StdioServerTransport());
}

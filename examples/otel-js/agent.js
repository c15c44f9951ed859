// A Node.js agent loop instrumented only with OpenTelemetry JS: no agent-watchdog code.
//
// It emits GenAI spans (semantic conventions for generative AI): an `invoke_agent` root span
// and, inside it, a `chat` span per model call (model, token usage) and an `execute_tool` span
// per tool call, exported over OTLP/HTTP protobuf to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the
// OTel JS exporter sends chunked bodies). Under `agent-watchdog exec` that endpoint is the
// daemon's receiver and the run is exec's:
//
//   agent-watchdog exec --agent js-bot --max-tool-calls 10 -- node examples/otel-js/agent.js
//
// Environment: AGENT_LOOPS (default 50), AGENT_PAUSE_MS (default 50), AGENT_NAME, plus the
// standard OTEL_* variables (OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_SCHEDULE_DELAY, ...).
'use strict';

const { trace, SpanStatusCode } = require('@opentelemetry/api');
const { NodeTracerProvider, BatchSpanProcessor } = require('@opentelemetry/sdk-trace-node');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
const { detectResources, envDetector, resourceFromAttributes } = require('@opentelemetry/resources');

const AGENT = process.env.AGENT_NAME || 'js-bot';
const MODEL = process.env.AGENT_MODEL || 'gpt-4o';
const LOOPS = parseInt(process.env.AGENT_LOOPS || '50', 10);
const PAUSE_MS = parseInt(process.env.AGENT_PAUSE_MS || '50', 10);

const provider = new NodeTracerProvider({
  // service.name here; OTEL_RESOURCE_ATTRIBUTES (agent_watchdog.run_id under exec) merged in by
  // hand: sdk-trace 2.x uses an explicit resource as it is, without the environment's attributes.
  resource: resourceFromAttributes({ 'service.name': AGENT })
    .merge(detectResources({ detectors: [envDetector] })),
  spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())],
});
provider.register();
const tracer = trace.getTracer('example.js-agent');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function search(query) {
  return `results for ${query}: see the next page`;
}

async function main() {
  console.log(`agent pid ${process.pid} starting ${LOOPS} rounds`);
  await tracer.startActiveSpan(`invoke_agent ${AGENT}`, {
    attributes: { 'gen_ai.operation.name': 'invoke_agent', 'gen_ai.agent.name': AGENT },
  }, async (root) => {
    for (let i = 0; i < LOOPS; i++) {
      const chat = tracer.startSpan(`chat ${MODEL}`, {
        attributes: { 'gen_ai.operation.name': 'chat', 'gen_ai.provider.name': 'openai',
                      'gen_ai.request.model': MODEL },
      });
      chat.setAttribute('gen_ai.response.model', MODEL);
      chat.setAttribute('gen_ai.usage.input_tokens', 1000);
      chat.setAttribute('gen_ai.usage.output_tokens', 200);
      chat.end();
      const args = { q: `refund policy page ${i}` };
      const tool = tracer.startSpan('execute_tool search', {
        attributes: { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': 'search',
                      'gen_ai.tool.call.id': `call_${process.pid}_${i}`,
                      'gen_ai.tool.call.arguments': JSON.stringify(args) },
      });
      try {
        search(args.q);
      } catch (err) {
        tool.setStatus({ code: SpanStatusCode.ERROR, message: String(err && err.name) });
      }
      tool.end();
      await sleep(PAUSE_MS);
    }
    root.end();
  });
  await provider.shutdown();
  console.log('agent done');
}

main().catch((err) => { console.error(err); process.exit(1); });

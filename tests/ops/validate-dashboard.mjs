// Validate provisioned Grafana dashboards offline against the JSON schema of @grafana/schema.
//
//   node tests/ops/validate-dashboard.mjs DASHBOARD.json… [--write-schemas DIR]
//
// The schemas are generated at run time from the TypeScript types the pinned @grafana/schema
// package ships (ts-json-schema-generator, `expose: none`, so every object is closed:
// additionalProperties false) and checked with ajv:
//   * the whole file against `Dashboard` (dist/types/veneer/dashboard.types.d.ts: the classic
//     dashboard JSON model that file provisioning reads);
//   * each panel's `options` and `fieldConfig.defaults.custom` against the `Options` and
//     `FieldConfig` types of its panel plugin (raw/composable/<type>/panelcfg/x/types.gen.d.ts);
//   * each target against `DataQuery` (common.gen.d.ts) plus the Prometheus query fields, which
//     @grafana/schema does not carry (they live in the Prometheus data source plugin);
// and a few structural rules the types cannot say: unique panel ids and refIds, panels inside the
// 24-column grid without overlaps, every query naming a data source.
// Exit status 0 when every file passes; otherwise each problem is printed with its JSON path.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const Ajv = require('ajv');
const tsj = require('ts-json-schema-generator');

const here = path.dirname(fileURLToPath(import.meta.url));
const schemaPkg = path.join(here, 'node_modules', '@grafana', 'schema');
const types = path.join(schemaPkg, 'dist', 'types');

function generate(file, type) {
  const config = { path: file, type, expose: 'none', skipTypeCheck: true, topRef: false, additionalProperties: false };
  return tsj.createGenerator(config).createSchema(type);
}

// Prometheus query fields (Grafana's Prometheus data source, PromQuery); everything else a target
// may carry comes from DataQuery.
const promQueryProps = {
  expr: { type: 'string', minLength: 1 },
  legendFormat: { type: 'string' },
  instant: { type: 'boolean' },
  range: { type: 'boolean' },
  exemplar: { type: 'boolean' },
  format: { enum: ['time_series', 'table', 'heatmap'] },
  interval: { type: 'string' },
  intervalFactor: { type: 'number' },
  editorMode: { enum: ['code', 'builder'] },
};

const args = process.argv.slice(2);
let writeDir = null;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--write-schemas') writeDir = args[++i];
  else files.push(args[i]);
}
if (files.length === 0) {
  console.error('usage: validate-dashboard.mjs DASHBOARD.json… [--write-schemas DIR]');
  process.exit(2);
}

const schemaVersion = JSON.parse(fs.readFileSync(path.join(schemaPkg, 'package.json'), 'utf8')).version;
const ajv = new Ajv({ allErrors: true, strict: false });
const schemas = { Dashboard: generate(path.join(types, 'veneer', 'dashboard.types.d.ts'), 'Dashboard') };
const dataQuery = generate(path.join(types, 'common', 'common.gen.d.ts'), 'DataQuery');
schemas.PromTarget = {
  ...dataQuery,
  properties: { ...dataQuery.properties, ...promQueryProps },
  required: [...new Set([...(dataQuery.required || []), 'expr'])],
};
const panelSchemas = new Map(); // plugin type -> { Options, FieldConfig } validators
function panelValidators(type) {
  if (!panelSchemas.has(type)) {
    const file = path.join(types, 'raw', 'composable', type, 'panelcfg', 'x', 'types.gen.d.ts');
    if (!fs.existsSync(file)) {
      panelSchemas.set(type, null);
    } else {
      const options = generate(file, 'Options');
      // Only a plugin that declares its own FieldConfig has custom field options.
      const declaresFieldConfig = /export (interface|type) FieldConfig\b/.test(fs.readFileSync(file, 'utf8'));
      const fieldConfig = declaresFieldConfig ? generate(file, 'FieldConfig') : null;
      schemas[`${type}.Options`] = options;
      if (fieldConfig) schemas[`${type}.FieldConfig`] = fieldConfig;
      panelSchemas.set(type, {
        options: ajv.compile(options),
        fieldConfig: fieldConfig && ajv.compile(fieldConfig),
      });
    }
  }
  return panelSchemas.get(type);
}
const validateDashboard = ajv.compile(schemas.Dashboard);
const validateTarget = ajv.compile(schemas.PromTarget);

function report(problems, where, errors) {
  for (const e of errors || []) {
    const extra = e.params && Object.keys(e.params).length ? ` ${JSON.stringify(e.params)}` : '';
    problems.push(`${where}${e.instancePath || ''}: ${e.message}${extra}`);
  }
}

function checkDashboard(file) {
  const problems = [];
  let dash;
  try {
    dash = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    return [`${file}: not JSON: ${e.message}`];
  }
  if (!validateDashboard(dash)) report(problems, '', validateDashboard.errors);
  for (const k of ['uid', 'title']) {
    if (typeof dash[k] !== 'string' || dash[k] === '') problems.push(`/${k}: a provisioned dashboard needs a ${k}`);
  }

  const panels = [];
  for (const [i, p] of (dash.panels || []).entries()) {
    panels.push([`/panels/${i}`, p]);
    for (const [j, q] of (p.panels || []).entries()) panels.push([`/panels/${i}/panels/${j}`, q]);
  }
  const ids = new Map();
  const cells = new Map();
  for (const [where, p] of panels) {
    if (typeof p.id !== 'number') problems.push(`${where}/id: every panel needs a numeric id`);
    else if (ids.has(p.id)) problems.push(`${where}/id: ${p.id} is also the id of ${ids.get(p.id)}`);
    else ids.set(p.id, where);

    const g = p.gridPos;
    if (!g) problems.push(`${where}/gridPos: missing`);
    else {
      if (g.x < 0 || g.w < 1 || g.x + g.w > 24) problems.push(`${where}/gridPos: x ${g.x} + w ${g.w} leaves the 24-column grid`);
      if (p.type !== 'row' || !p.collapsed) {
        for (let x = g.x; x < g.x + g.w; x++) {
          for (let y = g.y; y < g.y + g.h; y++) {
            const key = `${x},${y}`;
            if (cells.has(key)) {
              problems.push(`${where}/gridPos: overlaps ${cells.get(key)} at column ${x}, row ${y}`);
              y = g.y + g.h;
              x = g.x + g.w;
            } else cells.set(key, where);
          }
        }
      }
    }
    if (p.type === 'row') continue;
    if (typeof p.title !== 'string' || p.title === '') problems.push(`${where}/title: every panel needs a title`);

    const v = panelValidators(p.type);
    if (v === null) problems.push(`${where}/type: "${p.type}" has no panelcfg types in @grafana/schema ${schemaVersion}`);
    else {
      if (!v.options(p.options ?? {})) report(problems, `${where}/options`, v.options.errors);
      const custom = p.fieldConfig?.defaults?.custom;
      if (custom !== undefined) {
        if (!v.fieldConfig) problems.push(`${where}/fieldConfig/defaults/custom: "${p.type}" has no custom field config`);
        else if (!v.fieldConfig(custom)) report(problems, `${where}/fieldConfig/defaults/custom`, v.fieldConfig.errors);
      }
    }

    const targets = p.targets || [];
    if (targets.length === 0 && p.type !== 'text') problems.push(`${where}/targets: a data panel without a query`);
    const refIds = new Set();
    for (const [k, t] of targets.entries()) {
      const tw = `${where}/targets/${k}`;
      if (!validateTarget(t)) report(problems, tw, validateTarget.errors);
      if (refIds.has(t.refId)) problems.push(`${tw}/refId: "${t.refId}" repeats within the panel`);
      refIds.add(t.refId);
      if (!(t.datasource?.uid || p.datasource?.uid)) problems.push(`${tw}/datasource: neither the query nor its panel names a data source uid`);
    }
  }
  return problems;
}

if (writeDir) {
  fs.mkdirSync(writeDir, { recursive: true });
}
let failed = 0;
for (const file of files) {
  const problems = checkDashboard(file);
  if (problems.length) {
    failed++;
    console.error(`FAIL ${file} (against @grafana/schema ${schemaVersion}):`);
    for (const p of problems) console.error(`  ${p}`);
  } else {
    console.log(`ok ${file} (against @grafana/schema ${schemaVersion})`);
  }
}
if (writeDir) {
  for (const [name, s] of Object.entries(schemas)) {
    fs.writeFileSync(path.join(writeDir, `${name}.schema.json`), JSON.stringify(s, null, 2) + '\n');
  }
  console.log(`schemas written to ${writeDir}`);
}
process.exit(failed ? 1 : 0);

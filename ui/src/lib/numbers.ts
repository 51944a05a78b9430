import type { ConfigValue, JsonDouble } from './types';

/** Reads a double the gateway sent, turning its "NaN"/"Infinity" strings back into numbers. */
export function toNumber(value: JsonDouble | string | null | undefined): number {
  if (typeof value === 'number') return value;
  if (value === 'NaN') return NaN;
  if (value === 'Infinity') return Infinity;
  if (value === '-Infinity') return -Infinity;
  if (value === null || value === undefined || value === '') return NaN;
  return Number(value);
}

/** The plain value of a config value's oneof. */
export function configValue(value: ConfigValue | undefined): string | number | boolean | undefined {
  if (!value) return undefined;
  if (value.boolValue !== undefined) return value.boolValue;
  if (value.intValue !== undefined) return value.intValue;
  if (value.floatValue !== undefined) return toNumber(value.floatValue);
  if (value.stringValue !== undefined) return value.stringValue;
  return undefined;
}

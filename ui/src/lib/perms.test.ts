import { describe, expect, it } from 'vitest';
import { canStop, canSubmit } from './perms';
import type { RoleName, WhoAmI } from './types';

function me(role: RoleName | undefined, admin = false): WhoAmI {
  return {
    user: 'ada', userId: 'u-ada', admin, tokenName: 't', jobId: '', service: 'api',
    memberships: role ? [{ project: 'vision', user: 'ada', role }] : [],
  };
}

describe('canStop', () => {
  it('never lets a viewer stop', () => {
    expect(canStop(me('ROLE_VIEWER'), 'vision', 'u1', 'u1')).toBe(false);
  });
  it('lets a member stop only their own jobs', () => {
    expect(canStop(me('ROLE_MEMBER'), 'vision', 'u1', 'u1')).toBe(true);
    expect(canStop(me('ROLE_MEMBER'), 'vision', 'u2', 'u1')).toBe(false);
    expect(canStop(me('ROLE_MEMBER'), 'vision', 'u1', undefined)).toBe(false);
  });
  it('lets a maintainer and the admin stop any job', () => {
    expect(canStop(me('ROLE_MAINTAINER'), 'vision', 'u2', 'u1')).toBe(true);
    expect(canStop(me(undefined, true), 'other', 'u2', undefined)).toBe(true);
  });
  it('refuses in a project the user is not in', () => {
    expect(canStop(me('ROLE_MAINTAINER'), 'other', 'u1', 'u1')).toBe(false);
  });
});

describe('canSubmit', () => {
  it('needs member', () => {
    expect(canSubmit(me('ROLE_VIEWER'), 'vision')).toBe(false);
    expect(canSubmit(me('ROLE_MEMBER'), 'vision')).toBe(true);
  });
});

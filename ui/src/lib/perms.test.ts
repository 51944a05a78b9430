import { describe, expect, it } from 'vitest';
import {
  canCreateDataset, canDeleteDataset, canListSecrets, canManageMembers, canManageService, canSetAlias, canSetQuota, canStop, canSubmit,
  canSubmitSomewhere, canWriteSecrets, tokenRoles,
} from './perms';
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

describe('project management', () => {
  it('gives a viewer none of the writes', () => {
    const viewer = me('ROLE_VIEWER');
    expect(canManageMembers(viewer, 'vision')).toBe(false);
    expect(canListSecrets(viewer, 'vision')).toBe(false);
    expect(canWriteSecrets(viewer, 'vision')).toBe(false);
    expect(canCreateDataset(viewer, 'vision')).toBe(false);
    expect(canDeleteDataset(viewer, 'vision', 'ada')).toBe(false);
    expect(canSetQuota(viewer, 'project:vision')).toBe(false);
  });
  it('lets a member list secrets and create datasets, and delete only their own', () => {
    const member = me('ROLE_MEMBER');
    expect([canListSecrets(member, 'vision'), canWriteSecrets(member, 'vision')]).toEqual([true, false]);
    expect(canCreateDataset(member, 'vision')).toBe(true);
    expect(canDeleteDataset(member, 'vision', 'ada')).toBe(true);
    expect(canDeleteDataset(member, 'vision', 'bob')).toBe(false);
    expect(canManageMembers(member, 'vision')).toBe(false);
  });
  it('lets a maintainer manage members, secrets, anyone\'s datasets and the project quota', () => {
    const maintainer = me('ROLE_MAINTAINER');
    expect(canManageMembers(maintainer, 'vision')).toBe(true);
    expect(canWriteSecrets(maintainer, 'vision')).toBe(true);
    expect(canDeleteDataset(maintainer, 'vision', 'bob')).toBe(true);
    expect(canSetQuota(maintainer, 'project:vision')).toBe(true);
    expect(canSetQuota(maintainer, 'project:other')).toBe(false);
    expect(canSetQuota(maintainer, 'global')).toBe(false);
    expect(canSetQuota(maintainer, 'user:ada')).toBe(false);
    expect(canManageMembers(maintainer, 'other')).toBe(false);
  });
  it('lets the admin do all of it', () => {
    const admin = me(undefined, true);
    expect(canManageMembers(admin, 'vision') && canWriteSecrets(admin, 'vision') && canSetQuota(admin, 'global')).toBe(true);
  });
  it('narrows tokens to at most the user\'s role', () => {
    expect(tokenRoles(me('ROLE_VIEWER'), 'vision')).toEqual(['ROLE_VIEWER']);
    expect(tokenRoles(me('ROLE_MEMBER'), 'vision')).toEqual(['ROLE_VIEWER', 'ROLE_MEMBER']);
    expect(tokenRoles(me('ROLE_MEMBER'), 'other')).toEqual([]);
    expect(tokenRoles(me(undefined, true), 'other')).toHaveLength(3);
  });
});

describe('the Submit page, services and model aliases', () => {
  it('offers Submit to a member somewhere and to the admin, never to a viewer alone', () => {
    expect(canSubmitSomewhere(me('ROLE_VIEWER'))).toBe(false);
    expect(canSubmitSomewhere(me(undefined))).toBe(false);
    expect(canSubmitSomewhere(me('ROLE_MEMBER'))).toBe(true);
    expect(canSubmitSomewhere(me(undefined, true))).toBe(true);
  });
  it('lets a member scale their own services and a maintainer anyone\'s', () => {
    expect(canManageService(me('ROLE_VIEWER'), 'vision', 'u-ada', 'u-ada')).toBe(false);
    expect(canManageService(me('ROLE_MEMBER'), 'vision', 'u-ada', 'u-ada')).toBe(true);
    expect(canManageService(me('ROLE_MEMBER'), 'vision', 'u-bob', 'u-ada')).toBe(false);
    expect(canManageService(me('ROLE_MAINTAINER'), 'vision', 'u-bob', 'u-ada')).toBe(true);
  });
  it('lets a member move aliases, not a viewer', () => {
    expect(canSetAlias(me('ROLE_VIEWER'), 'vision')).toBe(false);
    expect(canSetAlias(me('ROLE_MEMBER'), 'vision')).toBe(true);
    expect(canSetAlias(me('ROLE_MEMBER'), 'other')).toBe(false);
    expect(canSetAlias(me(undefined, true), 'other')).toBe(true);
  });
});

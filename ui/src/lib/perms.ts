// What the signed-in user may do to a job, mirroring kiln_core::authz's policy so the page
// shows only the buttons that will work (the server decides anyway):
//   StopJob:   member on their own jobs, maintainer on anyone's (admin: everything)
//   SubmitJob: member of the project
//   ScaleService, UpdateService (traffic): as StopJob, on the service's owner
//   SetModelAlias, DeleteModelAlias: member of the model's project
//   AddMember, RemoveMember, SetSecret, DeleteSecret: maintainer of the project
//   ListSecrets, CreateDataset (and its upload): member of the project
//   DeleteDataset: member on the datasets they created, maintainer on anyone's
//   SetQuota, DeleteQuota: maintainer for `project:NAME`, the admin for users' and the global one
//   CreateToken: anyone, for themselves; one narrowed to a project carries at most their role there

import type { RoleName, WhoAmI } from './types';

const RANK: Record<RoleName, number> = { ROLE_UNSPECIFIED: 0, ROLE_VIEWER: 1, ROLE_MEMBER: 2, ROLE_MAINTAINER: 3 };

export function roleIn(me: WhoAmI, project: string): number {
  const membership = me.memberships.find((m) => m.project === project);
  return membership ? RANK[membership.role] ?? 0 : 0;
}

/**
 * Whether `me` may stop a job of `project` owned by the user id `ownerId`. `myUserId` is the
 * caller's user id when known: WhoAmI names the user while jobs carry the owner's id.
 */
export function canStop(me: WhoAmI, project: string, ownerId: string, myUserId: string | undefined): boolean {
  if (me.admin) return true;
  const rank = roleIn(me, project);
  if (rank >= RANK.ROLE_MAINTAINER) return true;
  return rank >= RANK.ROLE_MEMBER && myUserId !== undefined && ownerId === myUserId;
}

/** Whether `me` may submit a job to `project` (a re-run). */
export function canSubmit(me: WhoAmI, project: string): boolean {
  return me.admin || roleIn(me, project) >= RANK.ROLE_MEMBER;
}

/** Whether `me` may submit to some project: whether to offer the Submit page at all. */
export function canSubmitSomewhere(me: WhoAmI): boolean {
  return me.admin || me.memberships.some((m) => (RANK[m.role] ?? 0) >= RANK.ROLE_MEMBER);
}

/** Whether `me` may scale a service of `project` owned by `ownerId`, or change its traffic. */
export function canManageService(me: WhoAmI, project: string, ownerId: string, myUserId: string | undefined): boolean {
  return canStop(me, project, ownerId, myUserId);
}

/** Whether `me` may point and remove the aliases of a model of `project`. */
export function canSetAlias(me: WhoAmI, project: string): boolean {
  return me.admin || roleIn(me, project) >= RANK.ROLE_MEMBER;
}

/** Whether `me` may add and remove members of `project` and change their roles. */
export function canManageMembers(me: WhoAmI, project: string): boolean {
  return me.admin || roleIn(me, project) >= RANK.ROLE_MAINTAINER;
}

/** Whether `me` may list `project`'s secrets (their names: no one reads a value). */
export function canListSecrets(me: WhoAmI, project: string): boolean {
  return me.admin || roleIn(me, project) >= RANK.ROLE_MEMBER;
}

/** Whether `me` may set and delete `project`'s secrets. */
export function canWriteSecrets(me: WhoAmI, project: string): boolean {
  return me.admin || roleIn(me, project) >= RANK.ROLE_MAINTAINER;
}

/** Whether `me` may upload an archive to `project` and name it as a dataset. */
export function canCreateDataset(me: WhoAmI, project: string): boolean {
  return me.admin || roleIn(me, project) >= RANK.ROLE_MEMBER;
}

/** Whether `me` may delete a dataset of `project` that the user named `createdBy` created. */
export function canDeleteDataset(me: WhoAmI, project: string, createdBy: string): boolean {
  if (me.admin) return true;
  const rank = roleIn(me, project);
  if (rank >= RANK.ROLE_MAINTAINER) return true;
  return rank >= RANK.ROLE_MEMBER && createdBy === me.user;
}

/** Whether `me` may set or delete the quota of `scope` (`global`, `project:NAME`, `user:NAME`). */
export function canSetQuota(me: WhoAmI, scope: string): boolean {
  if (me.admin) return true;
  return scope.startsWith('project:') && roleIn(me, scope.slice('project:'.length)) >= RANK.ROLE_MAINTAINER;
}

/** The roles a token of `me` narrowed to `project` may carry: up to their own there. */
export function tokenRoles(me: WhoAmI, project: string): RoleName[] {
  const rank = me.admin ? RANK.ROLE_MAINTAINER : roleIn(me, project);
  return (['ROLE_VIEWER', 'ROLE_MEMBER', 'ROLE_MAINTAINER'] as const).filter((role) => RANK[role] <= rank);
}

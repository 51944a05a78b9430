// What the signed-in user may do to a job, mirroring kiln_core::authz's policy so the page
// shows only the buttons that will work (the server decides anyway):
//   StopJob:   member on their own jobs, maintainer on anyone's (admin: everything)
//   SubmitJob: member of the project

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
